"""Kubernetes mode's elastic training scale-out (issue 32 item 4; the reference's listenScheduleResult,
``podgroup.JudgeIsRunningByJobKey``): after a scale-in the job scales out when its PodGroup is
Running and the fault pod was replaced (another UID), not when the fault merely cleared."""

from __future__ import annotations

import asyncio

from brain.brainkit import Sims, decisions, npu_fault, wait_decision, wait_state
from kube.kubekit import job_pod, kube_clusterd, podgroup
from support import eventually

from clusterd.kube import podgroups as pgs

NS, UID = "train", "uid-job-1"


async def create_pod(api, name: str, node: str, rank_index: int, uid: str) -> None:
    pod = job_pod(name, node, rank_index, [0, 1])
    pod["metadata"]["uid"] = uid
    await api._call("create pod", api.core.create_namespaced_pod, NS, pod)


async def pg_phase(api, phase: str) -> None:
    await api.patch_custom(pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL, "llama-pg", {"status": {"phase": phase}})


async def test_scale_out_waits_for_the_podgroup_running_and_the_fault_pod_replaced(k8s, tmp_path):
    emu, api = k8s
    cd = await kube_clusterd(
        tmp_path, api.url, "--kube-resync-s", "0.5", "--report-timeout-s", "5", "--keepalive-s", "0.3",
        "--signal-send-s", "1.0", "--fault-flush-s", "0.01", "--scale-wait-s", "60",
    )  # fmt: skip
    sims = Sims(f"127.0.0.1:{cd.grpc_port}")
    try:
        await api._call(
            "create pg", api.custom.create_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL,
            podgroup({"process-recover-enable": "on"}, {"recover-strategy": "elastic-training"},
                     status={"phase": "Running"}),
        )  # fmt: skip
        await create_pod(api, "llama-worker-0", "node-1", 0, "uid-worker-0")
        await create_pod(api, "llama-worker-1", "node-2", 1, "uid-worker-1")
        await eventually(lambda: (j := cd.jobs.get(UID)) is not None and len(j.ranks) == 4, what="job")
        sim = await sims.start(UID, strategies=["downgrade", "exit"], status={"downgrade": 201})
        fault = npu_fault(node="node-2", dev=0)
        await cd.center.upsert(fault)
        await wait_decision(cd, "scale-in-success", job_id=UID, timeout_s=20)
        # Volcano: the fault pod's PodGroup is no longer complete; the fault clears meanwhile
        await pg_phase(api, "Pending")
        await cd.center.remove(fault.key)
        # the old judgement (no UnHealthy fault left) scaled out here; the PodGroup is not Running
        # and pod rank 1 is still the fault pod: the job keeps running scaled in
        await asyncio.sleep(2.5)  # > 2 polls of the scale-out wait (--poll 1 s)
        assert "scale-out-success" not in decisions(cd, UID)
        await wait_state(cd, "ScaleInRunning", job_id=UID)
        # the fault pod is replaced on node-3 (a new UID), but the PodGroup is still Pending
        await api._call("delete pod", api.core.delete_namespaced_pod, "llama-worker-1", NS)
        await create_pod(api, "llama-worker-1", "node-3", 1, "uid-worker-1-new")
        await eventually(
            lambda: sorted({r.node for r in cd.jobs.get(UID).ranks}) == ["node-1", "node-3"],
            what="pod replaced",
        )
        await asyncio.sleep(2.5)
        assert "scale-out-success" not in decisions(cd, UID)
        await pg_phase(api, "Running")
        await wait_decision(cd, "scale-out-success", job_id=UID, timeout_s=10)
        assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["downgrade", "upgrade"]
    finally:
        await sims.close()
        await cd.stop()
