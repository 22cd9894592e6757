"""wait-reschedule-timeout, the scale-in fallback and elastic training's resource wait
(MINDIO_WAIT_MINDX_TIME) -- clusterd.md §7.1, §7.3; waits scaled by --job-wait-scale 0.01."""

from __future__ import annotations

import pytest
from brain.brainkit import apply, decisions, npu_fault, vanish_in, wait_decision, wait_idle, wait_state

from clusterd.brain.jobs import JobSpecError, parse_job
from clusterd.brain.reschedule import resource_wait_s, wait_reschedule_s


async def test_recover_waits_for_the_fault_pods_then_for_the_status(cd, sims):
    await apply(cd)
    sim = await sims.start(status={"recover": "silent"})
    await cd.center.upsert(npu_fault())
    await wait_state(cd, "WaitReportProcessRecoverStatus")
    await cd.center.remove(npu_fault().key)  # the fault pod was replaced
    await wait_decision(cd, "reschedule-success")
    assert await sim.report_status(0, "recover") == 0
    assert await sim.report_status(0, "recover") == 0  # answered twice: the second is dropped
    await wait_decision(cd, "recover-success")
    await wait_idle(cd)
    assert decisions(cd) == ["pre-exit", "stop-train", "recover", "reschedule-success", "recover-success"]


async def test_reschedule_timeout_without_elastic_training_goes_to_fault_retry(cd, sims):
    await apply(cd, **{"wait-reschedule-timeout": 30})
    await sims.start(status={"recover": "silent"})
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    # 30 s x 0.01 ends well before the 2 s status wait
    assert d["reason"] == "fault pods not rescheduled in 30s (wait-reschedule-timeout)"
    await wait_decision(cd, "fault-retry")


async def test_reschedule_timeout_with_elastic_training_scales_in(cd, sims):
    await apply(cd, **{"wait-reschedule-timeout": 30, "recover-strategy": "recover,elastic-training"})
    sim = await sims.start(
        strategies=["recover", "downgrade", "exit"], status={"recover": "silent", "downgrade": 201}
    )
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "elastic-training")
    assert d["reason"] == "fault pods not rescheduled in 30s (wait-reschedule-timeout): scale-in"
    await wait_decision(cd, "scale-in-success")
    assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["recover", "downgrade"]
    down = sim.signals("changeStrategy")[1]
    assert (down["faultRanks"], down["nodeRankIds"]) == ([("2", "1"), ("3", "1")], ["1"])
    # pod 1 exited at the globalFault: not again (handleCheckScaleStrategyRecoverResult)
    assert sim.signals("faultNodesExit")[0]["nodeRankIds"] == []
    await cd.center.remove(npu_fault().key)
    await wait_decision(cd, "scale-out-success")


async def test_elastic_resource_wait_resources_back_means_no_scale_in(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training", "mindioWaitMindxTime": 60})
    sim = await sims.start(strategies=["downgrade", "exit"], mindio_wait_s=5.0)
    await cd.center.upsert(npu_fault())
    await wait_state(cd, "WaitResources")
    await cd.center.remove(npu_fault().key)
    d = await wait_decision(cd, "elastic-wait")
    assert d["reason"] == "fault pods rescheduled within 50s: no scale-in"
    await wait_decision(cd, "exit-completed")
    assert "elastic-training" not in decisions(cd)
    assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["exit"]


async def test_elastic_resource_wait_timeout_scales_in_before_mindio_gives_up(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training", "mindioWaitMindxTime": 60})
    sim = await sims.start(strategies=["downgrade", "exit"], status={"downgrade": 201}, mindio_wait_s=5.0)
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "elastic-wait")
    assert d["reason"] == "fault pods not rescheduled within 50s: scale-in"
    await wait_decision(cd, "scale-in-success")
    assert sim.signals("changeStrategy")[0]["changeStrategy"] == "downgrade"


async def test_mindio_gives_up_when_no_strategy_comes_in_time(cd, sims):
    # a flow that waits longer than MINDIO_WAIT_MINDX_TIME breaks the real MindIO: trainsim says so
    await apply(cd, **{"recover-strategy": "elastic-training", "mindioWaitMindxTime": 3600})
    sim = await sims.start(strategies=["downgrade", "exit"], mindio_wait_s=0.3, allow_errors=True)
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.errors, timeout_s=15)  # a loaded box may be slow to get there
    assert sim.errors == ["no changeStrategy within MINDIO_WAIT_MINDX_TIME (0.3s): MindIO gives up"]


async def test_client_vanishing_during_the_resource_wait_resets(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training", "mindioWaitMindxTime": 3600})
    sim = await sims.start(strategies=["downgrade", "exit"])
    await cd.center.upsert(npu_fault())
    await vanish_in(cd, sim, "WaitResources")


def test_wait_settings_ranges():
    base = {"id": "j", "name": "j", "ranks": [{"rank": 0, "node": "n", "device": 0}]}
    job = parse_job(base)
    assert (wait_reschedule_s(job), resource_wait_s(job)) == (270, 20)  # the reference's defaults
    assert wait_reschedule_s(parse_job(dict(base, **{"wait-reschedule-timeout": "45"}))) == 45
    from dataclasses import replace

    assert wait_reschedule_s(replace(job, extra={"wait-reschedule-timeout": "500"})) == 270  # PodGroup value
    assert wait_reschedule_s(replace(job, extra={"wait-reschedule-timeout": "90"})) == 90
    assert resource_wait_s(parse_job(dict(base, mindioWaitMindxTime=9))) == 20  # below 10: default
    assert resource_wait_s(parse_job(dict(base, mindioWaitMindxTime=60))) == 50
    for bad in (
        {"wait-reschedule-timeout": 29},
        {"wait-reschedule-timeout": "x"},
        {"mindioWaitMindxTime": 3601},
    ):
        with pytest.raises(JobSpecError):
            parse_job(dict(base, **bad))


async def test_client_vanishing_while_the_reschedule_watcher_runs_resets(cd, sims):
    await apply(cd)
    sim = await sims.start(status={"recover": "silent"})
    await cd.center.upsert(npu_fault())
    await vanish_in(cd, sim, "WaitReportProcessRecoverStatus")
    assert "reschedule-success" not in decisions(cd) and "fault-clear" not in decisions(cd)
