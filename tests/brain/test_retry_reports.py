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


def test_retry_filter_follows_the_reference_uce_scenario():
    """The reference's uce_scenario_test (clusterd.md §10), now = 100000 ms: a UCE younger than 10 s
    is hidden; one without a report and older is kept; one reported 5 s later is hidden for the 30 s
    complete window; one whose report is older than that is kept."""
    from clusterd.brain.faultview import RankFault

    spec = {"id": "j", "name": "j", "recover-strategy": "retry,recover", "process-recover-enable": "on",
            "ranks": [{"rank": r, "node": "n", "device": r} for r in range(4)]}  # fmt: skip
    job = parse_job(spec)
    assert job.process_recover_enable == "on"
    rr = RetryReports()

    def uce(rank: int, since: int, code: str = "80E01801") -> RankFault:
        return RankFault(rank, "n", rank, 0, code, "RestartBusiness", "0", since)

    rr.report("j", 2, "0", 95_000)
    rr.report("j", 3, "0", 60_000)
    assert rr.hidden_until(job, uce(0, 95_000), 100_000) == 105_000  # job1: within 10 s
    assert rr.hidden_until(job, uce(1, 80_000), 100_000) is None  # job2: no report
    assert rr.hidden_until(job, uce(2, 90_000), 100_000) == 125_000  # job3: complete window
    assert rr.hidden_until(job, uce(3, 55_000), 100_000) is None  # job4: past the window
    assert rr.hidden_until(job, uce(0, 95_000, "80E18402"), 100_000) is None  # not a retry code
    kept, soonest = rr.filter(job, [uce(r, s) for r, s in ((0, 95_000), (1, 80_000), (2, 90_000))], 100_000)
    assert [f.rank for f in kept] == [1] and soonest == 105_000
    no_retry = parse_job({**spec, "recover-strategy": "recover"})
    assert rr.hidden_until(no_retry, uce(0, 95_000), 100_000) is None
    off = parse_job({**spec, "process-recover-enable": "off"})
    assert rr.hidden_until(off, uce(0, 95_000), 100_000) is None


async def test_hardware_uce_waits_for_the_business_plane_then_starts_the_retry(cd, sims):
    await apply(cd)
    sim = await sims.start()
    cd.brain.retry_reports.hide_ms = 2_500
    await cd.center.upsert(npu_fault(code="80E01801", level="RestartBusiness"))
    await asyncio.sleep(0.5)
    assert decisions(cd) == []  # hidden: MindIO has 10 s (here 2.5 s) to report it
    await wait_decision(cd, "retry-success")  # nobody reported: the hardware fault acts
    assert decisions(cd) == ["stop-train", "retry", "retry-success"]
    assert sim.signals("globalFault")[0]["faultRanks"] == [("2", "0")]


async def test_hardware_uce_after_the_business_report_stays_hidden_in_the_complete_window(cd, sims):
    await apply(cd)
    sim = await sims.start()
    cd.brain.retry_reports.window_ms = 300  # the report's synthetic rank is gone before the chip's UCE
    assert await sim.report_process_fault([("2", "0")]) == 0  # MindIO found the UCE first
    await wait_decision(cd, "retry-success")
    await wait_idle(cd)
    await asyncio.sleep(0.4)
    # any change on the job's node has the brain look again (the synthetic rank is gone by now)
    await cd.center.upsert(npu_fault(dev=7, code="81078603", level="NotHandleFault"))
    await cd.center.upsert(npu_fault(code="80E01801", level="RestartBusiness"))  # the chip's own report
    await asyncio.sleep(0.6)  # past the 0.2 s hide: only the complete window (30 s) keeps it out
    assert decisions(cd) == ["stop-train", "retry", "retry-success"]
    assert len(sim.signals("stopTrain")) == 1
