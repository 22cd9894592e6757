"""Kubernetes mode's hot switch (issue 32 item 3; the reference's hot_switch_controller.go with the
Ascend Operator's handleHotSwitch): the backup pod comes from the Operator, asked for by annotating
the fault pod, and is waited for Running; the fault pod is deleted by Volcano before the migration;
the annotations are cleaned afterwards. The Operator is :class:`kube.operatorsim.OperatorSim`."""

from __future__ import annotations

import pytest
from brain.brainkit import Sims, decisions, npu_fault, signals, wait_decision, wait_idle, wait_state
from kube.kubekit import job_pod, kube_clusterd, podgroup
from kube.operatorsim import NS, OperatorSim
from support import eventually

from clusterd.kube import podgroups as pgs
from faultmesh.kube import KubeError

UID = "uid-job-1"
FAST = (
    "--kube-resync-s", "0.5", "--report-timeout-s", "5", "--keepalive-s", "0.3",
    "--signal-send-s", "1.0", "--fault-flush-s", "0.01",
)  # fmt: skip


async def start_job(api, cd, sims, strategies=("migration",), **labels: str):
    """The PodGroup and two pods (node-1: pod rank 0, node-2: pod rank 1; 2 NPUs each), a trainsim
    reporting ``strategies`` (pause for migration by default), and a SubHealthFault on node-2's NPU 0. Returns the sim."""
    await api._call(
        "create pg", api.custom.create_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL,
        podgroup(
            {"process-recover-enable": "on", **labels}, {"recover-strategy": "recover"},
            status={"phase": "Running"},
        ),
    )  # fmt: skip
    for i, node in enumerate(("node-1", "node-2")):
        pod = job_pod(f"llama-worker-{i}", node, i, [0, 1])
        pod["metadata"]["uid"] = f"uid-worker-{i}"
        await api._call("create pod", api.core.create_namespaced_pod, NS, pod)
    await eventually(
        lambda: (
            (j := cd.jobs.get(UID)) is not None
            and len(j.ranks) == 4
            and j.sub_healthy_strategy == "hotSwitch"
        ),
        what="job with subHealthyStrategy=hotSwitch",
    )
    sim = await sims.start(UID, strategies=None if strategies is None else list(strategies))
    await cd.center.upsert(npu_fault(node="node-2", dev=0, code="80818C06", level="SubHealthFault"))
    return sim


async def pod_annotations(api, name: str) -> dict | None:
    try:
        doc = await api._call("get pod", api.core.read_namespaced_pod, name, NS)
    except KubeError:
        return None
    return doc["metadata"].get("annotations") or {}


@pytest.fixture
async def hcd(k8s, tmp_path):
    emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, *FAST, "--hot-switch-wait-s", "8")
    yield cd
    await cd.stop()


@pytest.fixture
async def operated(k8s, hcd):
    """(api, the Operator stand-in running, trainsims against ``hcd``)."""
    emu, api = k8s
    operator = OperatorSim(api, backup_node="node-3")
    operator.start()
    sims = Sims(f"127.0.0.1:{hcd.grpc_port}")
    yield api, operator, sims
    try:
        await sims.close()
    finally:
        await operator.stop()


async def test_hot_switch_takes_the_operators_backup_pod(operated, hcd):
    api, operator, sims = operated
    sim = await start_job(api, hcd, sims, subHealthyStrategy="hotSwitch")
    # the old behaviour (a node of the job's own backupNodes; it has none) never gets here
    await wait_decision(hcd, "hot-switch-success", job_id=UID, timeout_s=30)
    await wait_idle(hcd, job_id=UID)
    # notifyCreateNewPod: the fault pod (pod rank 1) annotated for the Operator
    ann = operator.seen["llama-worker-1"]
    assert (ann["inHotSwitchFlow"], ann["needOperatorOpe"]) == ("true", "create")
    assert "llama-worker-0" not in operator.seen
    assert [s[:2] for s in signals(sim)] == [
        ("hot-switch", ("hot switch",)),
        ("hot-switch", ("new pod running",)),
        ("changeStrategy", ("change_strategy",)),
    ]
    # notifyDeleteOldPod: Volcano deleted the fault pod before the migration
    assert operator.deleted == ["llama-worker-1"]
    # cleanStateWhenSuccess: inHotSwitchFlow off the backup pod, which is now the job's pod
    backup = await eventually(lambda: pod_annotations(api, "llama-worker-1-backup"), what="backup pod")
    assert "inHotSwitchFlow" not in backup and "podType" not in backup
    await eventually(
        lambda: sorted({r.node for r in hcd.jobs.get(UID).ranks}) == ["node-1", "node-3"],
        what="the job's ranks on the backup pod's node",
    )
    assert hcd.jobs.get(UID).sub_healthy_strategy == "hotSwitch"


async def test_hot_switch_without_the_operator_stops_and_cleans_the_annotations(k8s, tmp_path):
    emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, *FAST, "--hot-switch-wait-s", "0.5")
    sims = Sims(f"127.0.0.1:{cd.grpc_port}")
    try:
        sim = await start_job(api, cd, sims, subHealthyStrategy="hotSwitch")
        await wait_decision(cd, "degrade-to-ignore", job_id=UID, timeout_s=20)
        await wait_idle(cd, job_id=UID)
        assert [s[1] for s in signals(sim)] == [("hot switch",), ("stop switch",)]
        assert "backup pod did not run" in next(
            d["reason"] for d in cd.brain.decisions[UID] if d["decision"] == "degrade-to-ignore"
        )
        # cleanStateWhenFailed: the fault pod's hot switch annotations removed again
        ann = await pod_annotations(api, "llama-worker-1")
        assert not {"inHotSwitchFlow", "needOperatorOpe", "backupNewPodName"} & set(ann)
        assert "hot-switch-success" not in decisions(cd, UID)
    finally:
        await sims.close()
        await cd.stop()


async def test_hot_switch_exit_only_cleans_up_and_has_the_operator_delete_the_backup(operated, hcd):
    api, operator, sims = operated
    # the training side cannot pause for migration
    await start_job(api, hcd, sims, strategies=["exit"], subHealthyStrategy="hotSwitch")
    await wait_decision(hcd, "kill-job", job_id=UID, timeout_s=30)
    # cleanStateWhenFailed: the fault pod's annotations removed, the backup pod deleted by the
    # Operator (needOperatorOpe=delete); the fault pod stays
    await eventually(lambda: "llama-worker-1-backup" in operator.deleted, what="backup pod deleted")
    ann = await pod_annotations(api, "llama-worker-1")
    assert not {"inHotSwitchFlow", "needOperatorOpe", "backupNewPodName"} & set(ann)
    assert operator.seen["llama-worker-1"]["needOperatorOpe"] == "create"
    assert decisions(hcd, UID)[-2:] == ["degrade-to-ignore", "kill-job"]


async def test_a_cancelled_hot_switch_cleans_the_annotations(operated, hcd):
    """The training side goes away while the switch waits for its pause report (the controller resets,
    the flow is cancelled): the fault pod's annotations are removed and the Operator deletes the
    backup pod, as after a failure (before: both stayed, and the Operator kept a backup pod no flow
    would use)."""
    api, operator, sims = operated
    sim = await start_job(api, hcd, sims, strategies=None, subHealthyStrategy="hotSwitch")
    await wait_state(hcd, "WaitReportRecoverStrategy", job_id=UID, timeout_s=20)
    assert (await pod_annotations(api, "llama-worker-1"))["inHotSwitchFlow"] == "true"
    sim.stop()
    d = await wait_decision(hcd, "reset", job_id=UID)
    assert d["reason"] == "signal stream ended"
    await eventually(lambda: "llama-worker-1-backup" in operator.deleted, what="backup pod deleted")

    async def cleaned():
        ann = await pod_annotations(api, "llama-worker-1")
        return ann is not None and not {"inHotSwitchFlow", "needOperatorOpe", "backupNewPodName"} & set(ann)

    await eventually(cleaned, what="fault pod annotations removed")
    assert "llama-worker-1" not in operator.deleted and not hcd.brain.ports.pods.switching(UID)


async def test_degrade_to_ignore_survives_the_pod_sync(k8s, tmp_path):
    """The failed switch degrades subHealthyStrategy to ignore (the reference's in-memory
    ctl.jobInfo); the next pod / PodGroup sync re-reads the PodGroup's label hotSwitch and must not
    undo it (before: it did, and the next sub-health fault started a hot switch again). A label
    changed to something else ends the degrade."""
    emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, *FAST, "--hot-switch-wait-s", "0.5")
    sims = Sims(f"127.0.0.1:{cd.grpc_port}")

    async def label(key, value):
        body = {"metadata": {"labels": {key: value}}}
        await api.patch_custom(pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL, "llama-pg", body)

    try:
        await start_job(api, cd, sims, subHealthyStrategy="hotSwitch")
        await wait_decision(cd, "degrade-to-ignore", job_id=UID, timeout_s=20)
        await wait_idle(cd, job_id=UID)
        await eventually(lambda: cd.jobs.get(UID).sub_healthy_strategy == "ignore", what="degraded")
        await label("pod-rescheduling", "on")  # the job is applied again from its PodGroup
        await eventually(lambda: cd.jobs.get(UID).pod_rescheduling == "on", what="PodGroup change applied")
        assert cd.jobs.get(UID).sub_healthy_strategy == "ignore"
        await label("subHealthyStrategy", "graceExit")
        await eventually(
            lambda: cd.jobs.get(UID).sub_healthy_strategy == "graceExit", what="the label's new value"
        )
    finally:
        await sims.close()
        await cd.stop()


async def test_a_switch_cancelled_while_the_fault_pod_awaits_deletion_takes_it_back(k8s, hcd):
    """Cancelled in WaitOldPodDeleted (Volcano has not deleted the fault pod yet): needVolcanoOpe and
    the fault-type label come off the fault pod too, so Volcano does not delete a pod whose backup
    is going away."""
    emu, api = k8s
    operator = OperatorSim(api, backup_node="node-3", volcano=False)
    operator.start()
    sims = Sims(f"127.0.0.1:{hcd.grpc_port}")
    try:
        sim = await start_job(api, hcd, sims, subHealthyStrategy="hotSwitch")
        await wait_state(hcd, "WaitOldPodDeleted", job_id=UID, timeout_s=20)

        async def marked():  # written on entering WaitOldPodDeleted: the pod patch may still be on its way
            pod = await api._call("get pod", api.core.read_namespaced_pod, "llama-worker-1", NS)
            ann, labels = pod["metadata"].get("annotations") or {}, pod["metadata"].get("labels") or {}
            return ann.get("needVolcanoOpe") == "delete" and labels.get("fault-type") == "SubHealth"

        await eventually(marked, what="needVolcanoOpe=delete and fault-type=SubHealth on the fault pod")
        sim.stop()
        await wait_decision(hcd, "reset", job_id=UID)
        await eventually(lambda: "llama-worker-1-backup" in operator.deleted, what="backup pod deleted")

        async def taken_back():
            pod = await api._call("get pod", api.core.read_namespaced_pod, "llama-worker-1", NS)
            ann, labels = pod["metadata"].get("annotations") or {}, pod["metadata"].get("labels") or {}
            return not {"needVolcanoOpe", "inHotSwitchFlow", "needOperatorOpe"} & set(ann) and (
                "fault-type" not in labels
            )

        await eventually(taken_back, what="the fault pod's hot switch marks removed")
    finally:
        await sims.close()
        await operator.stop()
