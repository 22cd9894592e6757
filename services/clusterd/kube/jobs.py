"""Training jobs discovered from pods (issue 8 "Discover jobs from pods"; reference clusterd.md §6.1,
§7.1, deviced.md §5.2).

A pod is a rank holder of a job when it is scheduled (``spec.nodeName``) and carries the annotations
the reference's scheduling stack sets:

- ``ascend.kubectl.kubernetes.io/ascend-910-configuration`` (or ``...ascend-npu-configuration``):
  JSON ``{"pod_name", "server_id", "devices": [{"device_id": "0", "device_ip": ...}, ...]}`` — the
  NPUs the device plugin gave the pod;
- ``hccl/rankIndex``: the pod's rank index in the job.

The job is the pod's controlling owner (``ownerReferences[controller=true]``: the vcjob or
AscendJob), so its id is that owner's UID, as the reference's jobId. Global ranks follow the
reference: ``rank = rankIndex x NPUs-per-pod + position`` of the device in the pod's sorted list.
The recovery settings the reference reads from the PodGroup (annotation ``recover-strategy``,
labels ``process-recover-enable``, ``fault-scheduling``, ``pod-rescheduling``,
``subHealthyStrategy``) are read from the job's Volcano PodGroup (:mod:`.podgroups`), else from the
pods' own labels and annotations (the first pod by rank index that has them). The rank-0 pod's
container env ``MINDIO_WAIT_MINDX_TIME`` (a literal value; clusterd.md §7.1) sets elastic training's
resource wait; a value that is no integer in 0..3600 is left out (the brain's default wait applies).
"""

from __future__ import annotations

import json
from typing import Any

DEVICE_ANNOTATIONS = (
    "ascend.kubectl.kubernetes.io/ascend-910-configuration",
    "ascend.kubectl.kubernetes.io/ascend-npu-configuration",
)
RANK_ANNOTATION = "hccl/rankIndex"
SETTING_KEYS = (
    "recover-strategy",
    "process-recover-enable",
    "fault-scheduling",
    "pod-rescheduling",
    "subHealthyStrategy",
)


class BadPod(ValueError):
    """A job pod whose annotations cannot be read (the message says which)."""


MINDIO_WAIT_ENV = "MINDIO_WAIT_MINDX_TIME"
MINDIO_WAIT_MAX_S = 3600


def pod_env(pod: dict, name: str) -> str | None:
    """The literal ``value`` of env ``name`` in the pod's first container that sets it (``valueFrom``
    references are not resolved: None)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for e in (c or {}).get("env") or []:
            if isinstance(e, dict) and e.get("name") == name:
                v = e.get("value")
                return v if isinstance(v, str) else None
    return None


def mindio_wait_of(pod: dict) -> int | None:
    """``MINDIO_WAIT_MINDX_TIME`` (s) of ``pod`` when it is an integer in 0..3600, else None."""
    raw = pod_env(pod, MINDIO_WAIT_ENV)
    try:
        v = int(str(raw).strip())
    except ValueError:
        return None
    return v if 0 <= v <= MINDIO_WAIT_MAX_S else None


MINDIE_LABELS = ("jobID", "app")  # the reference's MindIeJobIdLabelKey / MindIeAppTypeLabelKey
MINDIE_NPU_LESS = ("mindie-ms-coordinator", "mindie-ms-controller")


def is_job_pod(pod: dict) -> bool:
    """True for a pod that carries an NPU allocation annotation, or a MindIE coordinator /
    controller pod (labels ``jobID`` and ``app``; it has no NPUs, its IPs go into the global rank
    table, :mod:`clusterd.brain.mindie`)."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    return any(k in ann for k in DEVICE_ANNOTATIONS) or (
        bool(labels.get("jobID")) and labels.get("app") in MINDIE_NPU_LESS
    )


def pod_device_ips(pod: dict) -> dict[int, str]:
    """device id -> ``device_ip`` of the pod's NPU annotation (entries without one left out)."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw = next((ann[k] for k in DEVICE_ANNOTATIONS if k in ann), None)
    try:
        conf = json.loads(raw) if raw else {}
        return {
            int(d["device_id"]): str(d["device_ip"]) for d in conf.get("devices", []) if d.get("device_ip")
        }
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}


def job_owner(pod: dict) -> tuple[str, str] | None:
    """(uid, name) of the pod's controlling owner, or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid") and ref.get("name"):
            return str(ref["uid"]), str(ref["name"])
    return None


def pod_devices(pod: dict) -> tuple[int, list[int], int]:
    """(rank index, sorted device ids, super pod id or -1) of a job pod. Raises :class:`BadPod`."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw = next((ann[k] for k in DEVICE_ANNOTATIONS if k in ann), None)
    try:
        conf = json.loads(raw) if raw else None
    except ValueError:
        raise BadPod("device annotation is not JSON") from None
    if not isinstance(conf, dict) or not isinstance(conf.get("devices"), list):
        raise BadPod("device annotation has no devices list")
    try:
        devs = sorted(int(d["device_id"]) for d in conf["devices"])
    except (KeyError, TypeError, ValueError):
        raise BadPod("device annotation has a device without a numeric device_id") from None
    if len(set(devs)) != len(devs) or any(d < 0 or d > 1 << 16 for d in devs):
        raise BadPod("device annotation has duplicate or out-of-range device ids")
    try:
        rank_index = int(ann.get(RANK_ANNOTATION, ""))
    except ValueError:
        raise BadPod(f"annotation {RANK_ANNOTATION} is not an integer") from None
    if rank_index < 0:
        raise BadPod(f"annotation {RANK_ANNOTATION} is negative")
    spid_raw = conf.get("super_pod_id", ann.get("super_pod_id", -1))
    try:
        spid = int(spid_raw)
    except (TypeError, ValueError):
        spid = -1
    return rank_index, devs, spid


def job_status(pods: list[dict]) -> str:
    """pending / running / completed / failed from the pods' phases."""
    phases = [str((p.get("status") or {}).get("phase") or "Pending") for p in pods]
    if any(ph == "Failed" for ph in phases):
        return "failed"
    if phases and all(ph == "Succeeded" for ph in phases):
        return "completed"
    if any(ph == "Running" for ph in phases):
        return "running"
    return "pending"


def job_spec(
    job_id: str, name: str, namespace: str, pods: list[dict], settings: dict[str, str] | None = None
) -> dict[str, Any]:
    """The job spec (:func:`clusterd.brain.jobs.parse_job` input) of one job's pods; ``settings``
    (from the PodGroup) override the pods' recovery settings.

    A hot switch backup pod (annotation ``podType=backup``, issue 32) holds no rank until the Operator
    removes that annotation. Raises :class:`BadPod` for a pod with unreadable annotations or two
    pods with one rank index.
    """
    rows = []
    placed = []  # (node, pod IP, host IP) of every scheduled pod
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue  # not scheduled yet
        st = pod.get("status") or {}
        placed.append({"node": node, "podIp": st.get("podIP") or "", "hostIp": st.get("hostIP") or ""})
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        if ann.get("podType") == "backup":
            continue  # a hot switch backup pod: no rank until the Operator promotes it (its GetPodSlices)
        if not any(k in ann for k in DEVICE_ANNOTATIONS):
            continue  # a MindIE coordinator / controller pod: no NPUs
        rank_index, devs, spid = pod_devices(pod)
        rows.append((rank_index, node, devs, spid, pod))
    rows.sort(key=lambda r: r[0])
    if len({r[0] for r in rows}) != len(rows):
        raise BadPod(f"two pods of job {namespace}/{name} have the same {RANK_ANNOTATION}")
    ranks = []
    for rank_index, node, devs, spid, pod in rows:
        ips = pod_device_ips(pod)
        for pos, dev in enumerate(devs):
            ranks.append(
                {"rank": rank_index * len(devs) + pos, "node": node, "device": dev, "superPodId": spid}
                | ({"deviceIp": ips[dev]} if dev in ips else {})
            )
    spec: dict[str, Any] = {
        "id": job_id,
        "name": name,
        "namespace": namespace,
        "status": job_status(pods),
        "ranks": ranks,
    }
    if rows and rows[0][0] == 0 and (wait := mindio_wait_of(rows[0][4])) is not None:
        spec[MINDIO_WAIT_ENV] = wait  # the rank-0 pod's env (§7.1)
    for key in SETTING_KEYS:
        for *_, pod in rows:
            meta = pod.get("metadata") or {}
            value = (meta.get("annotations") or {}).get(key, (meta.get("labels") or {}).get(key))
            if value not in (None, ""):
                spec[key] = value
                break
    labels = next(
        (
            (p.get("metadata") or {}).get("labels") or {}
            for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get("jobID")
        ),
        {},
    )
    if labels.get("jobID"):  # a MindIE service member: its rank-table data (clusterd.brain.mindie)
        spec["jobID"], spec["app"] = labels["jobID"], labels.get("app", "")
        deploy = labels.get("grt-server/deploy-server") or labels.get("grt-group/deploy-server")
        if deploy:
            spec["deployServer"] = deploy
        spec["pods"] = [p for p in placed if p["podIp"]]
    spec.update(settings or {})
    return spec
