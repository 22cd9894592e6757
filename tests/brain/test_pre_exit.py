"""preExitProcess timing (issue 32 item 1): the reference's sendPreExitSignal first waits while the
controller is still INIT (sleepForStateChange, up to CheckCtlStateTimes x 1 s) and leaves out fault
pods replaced since the fault (their pod UID changed); trainsim plays TaskD."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from brain.brainkit import FAST, JOB, Sims, apply, decisions, npu_fault, signals, wait_decision, wait_idle
from support import make_clusterd

# pod rank 1 (node-b: ranks 2, 3) replaced on node-c
MOVED = [
    {"rank": r, "node": n, "device": r % 2} for r, n in enumerate(("node-a", "node-a", "node-c", "node-c"))
]


@contextlib.asynccontextmanager
async def clusterd_with(tmp_path, pre_exit_wait_s: float, two_fault_pods: bool = False, **over):
    """A ClusterD whose idle preExit waits ``pre_exit_wait_s``, the job applied (``over``), its
    trainsim running and an NPU fault on node-b (pod rank 1) sent (and one on node-a with
    ``two_fault_pods``); yields (cd, sim)."""
    cd = await make_clusterd(tmp_path, *FAST, "--pre-exit-wait-s", str(pre_exit_wait_s))
    sims = Sims(f"127.0.0.1:{cd.grpc_port}")
    try:
        await apply(cd, **over)
        sim = await sims.start()
        if two_fault_pods:  # node-a (pod rank 0) too
            await cd.center.upsert(npu_fault(node="node-a", dev=1))
        await cd.center.upsert(npu_fault())
        yield cd, sim
    finally:
        await sims.close()
        await cd.stop()


@pytest.mark.timeout(60)
async def test_an_idle_jobs_pre_exit_waits_for_taskds_own_report(tmp_path):
    # the workers died with the NPU: TaskD reports the process fault itself; the controller, still
    # INIT, holds its preExitProcess (a 30 s wait) until that flow has started, then sends it
    async with clusterd_with(tmp_path, 30.0) as (cd, sim):
        ctl = cd.brain.controllers[JOB]
        async with asyncio.timeout(5):  # the intake cached the fault; its preExitProcess waits
            while not ctl.cached_faults:
                await asyncio.sleep(0.02)
        assert not sim.signals("preExitProcess") and ctl.state == "INIT"
        assert await sim.report_process_fault([("2", "1")]) == 0  # TaskD's own ReportProcessFault
        await wait_decision(cd, "recover-success")  # well before the 30 s wait ends
        await wait_idle(cd)
        order = [s[0] for s in signals(sim)]
        assert order[:3] == ["stopTrain", "globalFault", "preExitProcess"], order
        pre = sim.signals("preExitProcess")[0]
        assert (pre["faultRanks"], pre["nodeRankIds"]) == ([("2", "1")], ["1"])
        assert decisions(cd)[:2] == ["stop-train", "recover"]


@pytest.mark.timeout(60)
async def test_an_idle_jobs_pre_exit_leaves_out_a_replaced_pod(tmp_path):
    # within the wait the fault pod (pod rank 1, node-b) is replaced on node-c: its new pod has no
    # fault worker to stop, the reference's UID check skips it; with no pod left nothing is sent
    async with clusterd_with(tmp_path, 1.0) as (cd, sim):
        await apply(cd, ranks=MOVED)  # the fault pod replaced
        d = await wait_decision(cd, "pre-exit-skipped")
        assert d["reason"] == "every fault pod was replaced"
        assert not sim.signals("preExitProcess") and "pre-exit" not in decisions(cd)


@pytest.mark.timeout(60)
async def test_an_idle_jobs_pre_exit_keeps_the_pods_not_replaced(tmp_path):
    # two fault pods; only pod rank 1 is replaced: preExitProcess names pod rank 0's fault alone
    async with clusterd_with(tmp_path, 1.0, two_fault_pods=True) as (cd, sim):
        await apply(cd, ranks=MOVED)  # the fault pod replaced
        await sim.wait_for(lambda ev: sim.signals("preExitProcess"))
        pres = sim.signals("preExitProcess")
        assert [(p["faultRanks"], p["nodeRankIds"]) for p in pres] == [([("1", "1")], ["0"])]
