"""Kubernetes mode, the controller's pod port (issue 32 items 3 and 4): what a recovery controller asks
of the job's pods and PodGroup (:class:`clusterd.brain.ports.PodsPort`), read from the pods and
PodGroups watches (:mod:`.podjobs`, :mod:`.podgroups`) and written through the hand-off's retried
calls (:mod:`.handoff`).

- **Hot switch's backup pod** (the reference's hot_switch_controller.go, with the Ascend Operator's
  ``handleHotSwitch`` and ClusterD's pod informer): ClusterD annotates the fault pod
  ``inHotSwitchFlow=true`` and ``needOperatorOpe=create`` (notifyCreateNewPod; only the first fault
  pod); the Operator creates a backup pod from the same template, annotated ``podType=backup`` and
  ``backupSourcePodName=<fault pod>``, and writes ``backupNewPodName=<backup pod>`` on the fault pod;
  ClusterD waits (at most the hot-switch timeout, the reference's 1 min) for that backup pod
  ``Running``. After the training side paused for migration the fault pod gets
  ``needVolcanoOpe=delete`` and the label ``fault-type=SubHealth`` (notifyDeleteOldPod) and ClusterD
  waits for it to be deleted. Success: ``inHotSwitchFlow`` removed from the backup pod
  (cleanStateWhenSuccess); failure: ``inHotSwitchFlow``, ``backupNewPodName`` and ``needOperatorOpe``
  removed from the fault pod and ``needOperatorOpe=delete`` on the backup pod (cleanStateWhenFailed).
  A switch cancelled midway (the controller reset: the training side went away or re-registered,
  the job ended, an operator reset) is cleaned as a failure, and a ``needVolcanoOpe=delete`` /
  ``fault-type=SubHealth`` it wrote on the fault pod is removed too: nobody migrates to the backup
  pod any more (the reference's reset only forgets the pods, leaving the Operator's annotations).
- **Resources back** (the reference's listenScheduleResult, ``podgroup.JudgeIsRunningByJobKey``):
  the job's PodGroup is ``Running`` and every pod rank that was told to exit has a ``Running`` pod
  that is not the one it had then (another UID: the fault pod was replaced).
"""

from __future__ import annotations

import logging
import time

from clusterd.kube import jobs as kjobs
from clusterd.kube import podgroups as pgs
from clusterd.kube.handoff import FAULT_TYPE_LABEL, HandOff
from clusterd.kube.podjobs import PodJobs
from faultmesh.log import event
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.kube")

IN_HOT_SWITCH = "inHotSwitchFlow"
BACKUP_NEW_POD = "backupNewPodName"
BACKUP_SOURCE_POD = "backupSourcePodName"
NEED_OPERATOR_OPE = "needOperatorOpe"
NEED_VOLCANO_OPE = "needVolcanoOpe"
POD_TYPE, POD_TYPE_BACKUP = "podType", "backup"
SUB_HEALTH_FAULT = "SubHealth"  # the reference's SubHealthFaultStrategy (label fault-type)


def _meta(pod: dict) -> dict:
    return pod.get("metadata") or {}


def _ann(pod: dict) -> dict:
    return _meta(pod).get("annotations") or {}


def _running(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def is_backup(pod: dict) -> bool:
    """True for a hot switch backup pod the Operator created (``podType=backup``)."""
    return _ann(pod).get(POD_TYPE) == POD_TYPE_BACKUP


class KubePods:
    """The pod port in Kubernetes mode (module docstring). ``pods``: the pods view, ``podgroups``:
    the PodGroups view, ``handoff``: its API client (set at start) and retried calls."""

    def __init__(self, pods: PodJobs, podgroups: pgs.PodGroups, handoff: HandOff) -> None:
        self.pods = pods
        self.podgroups = podgroups
        self.h = handoff
        self._switch: dict[str, list[str]] = {}  # job id -> [namespace, fault pod, backup pod or ""]
        self._deleting: set[str] = set()  # jobs whose fault pod got needVolcanoOpe=delete

    # -- views --------------------------------------------------------------------------------------
    def _pod_rank(self, pod: dict) -> int:
        try:
            return int(_ann(pod).get(kjobs.RANK_ANNOTATION, -1))
        except ValueError:
            return -1

    def pod_uids(self, job_id: str) -> dict[int, str]:
        """Pod rank (``hccl/rankIndex``) -> UID of the job's pods now (backup pods left out)."""
        return {
            self._pod_rank(p): str(_meta(p).get("uid") or "")
            for p in self.pods.pods_of(job_id)
            if not is_backup(p) and self._pod_rank(p) >= 0
        }

    def resources_back(self, job_id: str, old_uids: dict[int, str]) -> bool | None:
        """PodGroup ``Running`` and each pod rank of ``old_uids`` has a Running pod with another UID.
        None when the job has no PodGroup (the caller judges by fault health)."""
        if self.podgroups.get(job_id) is None:
            return None
        if self.podgroups.phase(job_id) != "Running":
            return False
        now = {
            self._pod_rank(p): str(_meta(p).get("uid") or "")
            for p in self.pods.pods_of(job_id)
            if not is_backup(p) and _running(p)
        }
        return all(now.get(rank, uid) != uid for rank, uid in old_uids.items())

    def _find(self, job_id: str, pred) -> dict | None:
        return next((p for p in self.pods.pods_of(job_id) if pred(p)), None)

    async def _until(self, cond, timeout_s: float):
        """``cond()``'s value once truthy, re-checked at each pod event for up to ``timeout_s``
        (None when it stayed falsy)."""
        deadline = time.monotonic() + timeout_s
        while not (value := cond()):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await wait_for(self.pods.changed().wait(), left)
            except TimeoutError:
                return None
        return value

    async def _patch(self, ns: str, name: str, body: dict) -> bool:
        api = self.h.api
        if api is None:
            return False
        return await self.h._call("hot_switch", lambda: api.patch_pod(ns, name, body))

    # -- hot switch ---------------------------------------------------------------------------------
    async def request_backup(self, job_id: str, node: str, timeout_s: float) -> str | None:
        """notifyCreateNewPod on the job's pod on ``node``, then wait up to ``timeout_s`` for its
        backup pod Running. Returns the backup pod's node, None when it did not run in time."""
        src = self._find(job_id, lambda p: (p.get("spec") or {}).get("nodeName") == node and not is_backup(p))
        if src is None:
            return None
        ns, name = _meta(src).get("namespace", ""), _meta(src).get("name", "")
        body = {"metadata": {"annotations": {IN_HOT_SWITCH: "true", NEED_OPERATOR_OPE: "create"}}}
        if not await self._patch(ns, name, body):
            return None
        self._switch[job_id] = [ns, name, ""]
        event(log, logging.INFO, "hot switch backup pod requested", job=job_id, pod=f"{ns}/{name}")
        pod = await self._until(
            lambda: self._find(
                job_id, lambda p: is_backup(p) and _ann(p).get(BACKUP_SOURCE_POD) == name and _running(p)
            ),
            timeout_s,
        )
        backup_node = (pod.get("spec") or {}).get("nodeName") if pod is not None else None
        if not backup_node:
            event(log, logging.WARNING, "hot switch backup pod not running", job=job_id, pod=f"{ns}/{name}")
            return None
        self._switch[job_id][2] = _meta(pod).get("name", "")
        event(log, logging.INFO, "hot switch backup pod running", job=job_id, node=backup_node)
        return backup_node

    async def delete_old_pod(self, job_id: str, timeout_s: float) -> bool:
        """notifyDeleteOldPod: ``needVolcanoOpe=delete`` and ``fault-type=SubHealth`` on the fault pod,
        then wait up to ``timeout_s`` for it to be deleted. True when it is gone."""
        if job_id not in self._switch:
            return False
        ns, name, _ = self._switch[job_id]
        body = {
            "metadata": {
                "annotations": {NEED_VOLCANO_OPE: "delete"},
                "labels": {FAULT_TYPE_LABEL: SUB_HEALTH_FAULT},
            }
        }
        self._deleting.add(job_id)
        await self._patch(ns, name, body)
        gone = await self._until(
            lambda: self._find(job_id, lambda p: _meta(p).get("name") == name and not is_backup(p)) is None,
            timeout_s,
        )
        return bool(gone)

    def switching(self, job_id: str) -> bool:
        """True while a switch of ``job_id`` holds pod annotations that :meth:`end_switch` undoes."""
        return job_id in self._switch

    async def end_switch(self, job_id: str, ok: bool, cancelled: bool = False) -> None:
        """cleanStateWhenSuccess (``ok``) or cleanStateWhenFailed (module docstring); ``cancelled``
        (a flow cancelled midway) also takes back a ``needVolcanoOpe=delete`` of the fault pod."""
        switch = self._switch.pop(job_id, None)
        deleting = job_id in self._deleting
        self._deleting.discard(job_id)
        if switch is None:
            return
        ns, name, new = switch
        if not new:  # not seen Running: the backup the Operator named on the fault pod, if any
            src = self._find(job_id, lambda p: _meta(p).get("name") == name)
            new = str(_ann(src).get(BACKUP_NEW_POD) or "") if src is not None else ""
        backup = self._find(job_id, lambda p: bool(new) and _meta(p).get("name") == new)
        if ok:
            if backup is not None:
                await self._patch(ns, new, {"metadata": {"annotations": {IN_HOT_SWITCH: None}}})
            return
        gone = {IN_HOT_SWITCH: None, BACKUP_NEW_POD: None, NEED_OPERATOR_OPE: None}
        body: dict = {"metadata": {"annotations": gone}}
        if cancelled and deleting:
            gone[NEED_VOLCANO_OPE] = None
            body["metadata"]["labels"] = {FAULT_TYPE_LABEL: None}
        if self._find(job_id, lambda p: _meta(p).get("name") == name and not is_backup(p)) is not None:
            await self._patch(ns, name, body)
        if backup is not None:
            body = {"metadata": {"annotations": {NEED_OPERATOR_OPE: "delete"}}}
            await self._patch(ns, new, body)
        how = "cancelled" if cancelled else "after failure"
        event(log, logging.INFO, f"hot switch cleaned {how}", job=job_id, pod=f"{ns}/{name}")
