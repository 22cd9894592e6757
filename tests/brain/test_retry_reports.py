"""Retry-type ranks of ReportProcessFault go to the retry processor (clusterd.md §2.1, §6.4), and a
sub-health rank on an UnHealthy job is never a stop-train rank (issue 14)."""

from __future__ import annotations

import asyncio

from brain.brainkit import JOB, apply, decisions, npu_fault, signals, wait_decision, wait_idle

from clusterd.brain.jobs import parse_job
from clusterd.brain.retryproc import RetryReports
from faultmesh.model import Fault


def slow_node(node="node-b") -> Fault:
    """FD-OL's slow-node confirmation (110001010, SubHealthFault, node scope)."""
    return Fault(source="fd-online", node=node, device_type="Node", device_id=-1, code="110001010",
                 level="SubHealthFault")  # fmt: skip


async def test_retry_report_starts_the_retry_through_the_fault_intake(cd, sims):
    await apply(cd)
    sim = await sims.start()
    assert await sim.report_process_fault([("2", "0")]) == 0  # MindIO found a UCE itself
    await wait_decision(cd, "retry-success")
    await wait_idle(cd)
    assert decisions(cd) == ["stop-train", "retry", "retry-success"]
    stop = cd.brain.decisions[JOB][0]
    assert stop["reason"] == "hardware fault on the job's ranks"  # the synthetic rank, not "process fault"
    assert [(f["rank"], f["code"], f["fault_type"]) for f in stop["faults"]] == [(2, "80E01801", "0")]
    assert [s[0] for s in signals(sim)] == ["stopTrain", "globalFault", "changeStrategy"]
    assert sim.signals("globalFault")[0]["faultRanks"] == [("2", "0")]


async def test_hccl_retry_report_without_retry_configured_is_a_normal_fault(cd, sims):
    await apply(cd, recover_strategy="recover,dump")
    sim = await sims.start()
    assert await sim.report_process_fault([("3", "2")]) == 0
    await wait_decision(cd, "recover-success")
    # no retry configured: the synthetic 8C1F860B rank is type "1" -> preExitProcess, TaskD's report
    assert decisions(cd) == ["pre-exit", "stop-train", "recover", "recover-success"]
    pre = sim.signals("preExitProcess")[0]
    assert (pre["faultRanks"], pre["nodeRankIds"]) == ([("3", "1")], ["1"])


async def test_retry_report_while_a_flow_runs_starts_no_second_flow(cd, sims):
    await apply(cd)
    sim = await sims.start(stop="silent")
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("stopTrain"))
    assert await sim.report_process_fault([("0", "0")]) == 0
    await wait_decision(cd, "fault-clear")  # the running flow's own stop-complete timeout
    await wait_idle(cd)
    assert decisions(cd).count("stop-train") == 1 and len(sim.signals("stopTrain")) == 1


def test_retry_reports_expire_after_the_window():
    job = parse_job({"id": "j", "name": "j", "recover-strategy": "retry",
                     "ranks": [{"rank": 0, "node": "n", "device": 0}, {"rank": 1, "node": "n", "device": 1}]})  # fmt: skip
    rr = RetryReports(window_ms=10_000)
    rr.report("j", 1, "2", 1_000)
    (f,) = rr.synthetic(job, [], 11_000)
    assert (f.rank, f.code, f.level, f.fault_type) == (1, "8C1F860B", "RestartBusiness", "2")
    assert rr.synthetic(job, [], 11_001) == []  # older than 10 s: forgotten
    rr.report("j", 0, "0", 0)
    hw = rr.synthetic(job, [], 0)
    assert rr.synthetic(job, hw, 0) == []  # a rank with its own UCE gets no synthetic one
    try:
        rr.report("j", 0, "1", 0)
    except ValueError as e:
        assert "not a retry fault type" in str(e)
    else:
        raise AssertionError("type 1 accepted")


async def test_slow_node_on_an_unhealthy_job_is_no_stop_train_rank(cd, sims):
    await apply(cd)
    await sims.start(stop="silent")
    # a UCE on rank 2 and FD-OL's slow-node confirmation on node-a in the same batch
    await cd.center.apply([npu_fault(code="80E01801", level="RestartBusiness"), slow_node("node-a")], [], "t")
    d = await wait_decision(cd, "stop-train")
    assert [(f["rank"], f["code"]) for f in d["faults"]] == [(2, "80E01801")]


async def test_slow_node_on_an_unhealthy_unregistered_job_decides_nothing(cd):
    await apply(cd)
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "job-rescheduling")
    await cd.center.upsert(slow_node())
    await asyncio.sleep(0.3)
    assert decisions(cd) == ["job-rescheduling"]
