"""Graceful tolerance excludes process-level recovery (issue 32 item 9; the reference's user guide:
graceful tolerance cannot be on together with process-level rescheduling or online recovery; if
both are on, training is recovered by Job-level rescheduling).

A deviced-like agent of node-b says ``graceTolerance=on`` in its Hello and reports an NPU fault of
the job through its stream; trainsim plays TaskD. The job with process recovery gets Job-level
rescheduling and none of the process-level signals; the same job beside a deviced without the
mode runs the process-level flow; a job without process recovery is not touched by the rule."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from brain.brainkit import FAST, JOB, Sims, apply, decisions, npu_fault, wait_decision
from support import eventually, http_call, make_clusterd

from faultmesh.agent import AgentClient
from faultmesh.exclusions import GRACE_LABEL

GRACE_REASON = "graceful tolerance on node node-b excludes process-level recovery"


def exclusions_counted(cd) -> float:
    return sum(
        s.value
        for m in cd.registry.collect()
        if m.name == "faultmesh_brain_grace_exclusions"
        for s in m.samples
        if s.name.endswith("_total")
    )


@contextlib.asynccontextmanager
async def cluster(tmp_path, grace: bool, **job):
    """ClusterD, the job applied (``job``: overrides), a deviced agent on node-b (``grace``: with the
    Hello label) that has said Hello; yields (cd, sims, agent, JobInfos the agent received)."""
    cd = await make_clusterd(tmp_path, *FAST)
    infos = []

    async def on_control(msg):
        if msg.WhichOneof("body") == "job":
            infos.append(msg.job)

    agent = AgentClient(
        f"127.0.0.1:{cd.grpc_port}", "node-b", "deviced", on_control=on_control, backoff_max_s=0.3,
        labels={GRACE_LABEL: "on"} if grace else None,
    )  # fmt: skip
    sims = Sims(f"127.0.0.1:{cd.grpc_port}")
    try:
        await apply(cd, **job)
        await agent.start()
        await agent.wait_synced()
        await eventually(lambda: infos, what="the job's JobInfo on node-b's deviced")
        yield cd, sims, agent, infos
    finally:
        await agent.stop()
        await sims.close()
        await cd.stop()


@pytest.mark.timeout(60)
async def test_process_recovery_on_a_grace_node_is_rescheduled_at_job_level(tmp_path):
    async with cluster(tmp_path, grace=True) as (cd, sims, agent, infos):
        # deviced learns the job's process-recovery settings (it then runs no grace episode for it)
        assert (infos[-1].process_recover_enable, list(infos[-1].recover_strategy)) == (
            "on",
            ["retry", "recover", "dump"],
        )
        sim = await sims.start()
        agent.state.upsert(npu_fault())  # RestartNPU on node-b/0 (rank 2), as deviced reports it
        d = await wait_decision(cd, "job-rescheduling")
        assert d["flow"] == "recovery" and d["reason"].startswith(GRACE_REASON)
        assert [(f["node"], f["rank"]) for f in d["faults"]] == [("node-b", 2)]
        # TaskD's own ReportProcessFault (the workers died with the chip) starts no flow either
        assert await sim.report_process_fault([("2", "1")]) == 0
        await eventually(lambda: decisions(cd).count("job-rescheduling") == 2, what="the second decision")
        ctl = cd.brain.controllers[JOB]
        assert ctl.state == "INIT" and not ctl.busy()
        assert not sim.signals("preExitProcess") and not sim.signals("stopTrain")
        assert set(decisions(cd)) == {"job-rescheduling"}
        assert exclusions_counted(cd) == 1  # logged and counted once per job
        st, node = await asyncio.to_thread(
            http_call, "GET", f"http://{cd.http.host}:{cd.http.port}/v1/nodes/node-b"
        )
        assert st == 200 and node["labels"] == {"deviced": {GRACE_LABEL: "on"}}


@pytest.mark.timeout(60)
async def test_the_same_job_beside_a_deviced_without_grace_runs_the_process_level_flow(tmp_path):
    async with cluster(tmp_path, grace=False) as (cd, sims, agent, _):
        sim = await sims.start()
        agent.state.upsert(npu_fault())
        await sim.wait_for(lambda ev: sim.signals("preExitProcess"))
        assert "job-rescheduling" not in decisions(cd) and exclusions_counted(cd) == 0
        assert cd.nodes.get("node-b").labels == {}


@pytest.mark.timeout(60)
async def test_a_job_without_process_recovery_on_a_grace_node_is_not_excluded(tmp_path):
    # process recovery off: the job keeps its grace episode on deviced (tests/deviced) and, with no
    # process-recovery client, clusterd's usual rescheduling decision, not the exclusion's
    async with cluster(tmp_path, grace=True, process_recover_enable="off", recover_strategy="dump") as (
        cd,
        _,
        agent,
        infos,
    ):
        assert (infos[-1].process_recover_enable, list(infos[-1].recover_strategy)) == ("", ["dump"])
        agent.state.upsert(npu_fault())
        d = await wait_decision(cd, "job-rescheduling")
        assert d["reason"].startswith("no process-recovery client registered")
        assert exclusions_counted(cd) == 0


@pytest.mark.timeout(60)
async def test_the_exclusion_ends_when_the_grace_deviced_says_hello_without_the_mode(tmp_path):
    async with cluster(tmp_path, grace=True) as (cd, sims, agent, _):
        await agent.stop()
        plain = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-b", "deviced", backoff_max_s=0.3)
        await plain.start()
        try:
            await plain.wait_synced()
            await eventually(lambda: cd.nodes.get("node-b").labels == {}, what="the mode dropped")
            sim = await sims.start()
            plain.state.upsert(npu_fault())
            await sim.wait_for(lambda ev: sim.signals("preExitProcess"))
            assert "job-rescheduling" not in decisions(cd)
        finally:
            await plain.stop()
