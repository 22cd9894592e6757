"""Sub-health strategies (clusterd.md §7.2-7.3, principles 亚健康热切): ignore, graceExit, hotSwitch + fallbacks."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from brain.brainkit import JOB, apply, decisions, npu_fault, signals, wait_decision, wait_idle

from faultmesh.model import Fault


def sub(node="node-b", dev=0):
    return npu_fault(node=node, dev=dev, code="80818C06", level="SubHealthFault")


async def test_ignore_keeps_training(cd, sims):
    await apply(cd)
    sim = await sims.start()
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "ignore")
    assert d["flow"] == "sub-health" and d["faults"][0]["rank"] == 2
    assert signals(sim) == []


async def test_grace_exit_saves_then_exits(cd, sims):
    await apply(cd, subHealthyStrategy="graceExit", recover_strategy="dump")
    sim = await sims.start()
    await cd.center.upsert(sub())
    await wait_decision(cd, "exit-completed", timeout_s=30)  # three paced signals: ~3 s, more on a loaded box
    # the reference (notifyFaultInfoForJob -> sendPreExitSignal, then shouldDumpWhenOccurFault):
    # preExitProcess for the fault rank; the dump only after TaskD's ReportProcessFault
    assert [s[0] for s in signals(sim)] == ["preExitProcess", "saveAndExit", "changeStrategy"]
    pre = sim.signals("preExitProcess")[0]
    assert (pre["faultRanks"], pre["nodeRankIds"]) == ([("2", "1")], ["1"])
    report = next(i for i, e in enumerate(sim.events) if e.get("rpc") == "ReportProcessFault")
    save = next(i for i, e in enumerate(sim.events) if e.get("signalType") == "saveAndExit")
    assert report < save
    assert sim.signals("saveAndExit")[0]["faultRanks"] == [("2", "1")]
    assert sim.signals("changeStrategy")[0]["extraParams"] == "dump_exit"
    assert decisions(cd) == ["pre-exit", "stop-train", "dump", "dump-success", "exit-completed"]


async def test_grace_exit_without_taskds_report_does_not_dump(cd, sims):
    # TaskD never reports the stopped rank: no recovery flow starts, so no dump (the reference
    # dumps only on the FaultOccurEvent of ReportProcessFault)
    await apply(cd, subHealthyStrategy="graceExit", recover_strategy="dump")
    sim = await sims.start(process_fault="silent")
    await cd.center.upsert(sub())
    await wait_decision(cd, "pre-exit")
    await sim.wait_for(lambda ev: sim.signals("preExitProcess"))
    assert not cd.brain.controllers[JOB].busy() and decisions(cd) == ["pre-exit"]
    assert [s[0] for s in signals(sim)] == ["preExitProcess"]


async def test_hot_switch_moves_the_pod_to_a_backup(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch")
    sim = await sims.start(strategies=["migration"])
    await cd.center.upsert(sub())
    await wait_decision(cd, "hot-switch-success")
    await wait_idle(cd)
    assert signals(sim) == [
        ("hot-switch", ("hot switch",), ""),
        ("hot-switch", ("new pod running",), ""),
        ("changeStrategy", ("change_strategy",), "migration"),
    ]
    # the backup is ready at once, but TaskD answers nothing to "hot switch": "new pod running"
    # waits for TaskD's 1 s tick (--command-gap-s), else the first never reaches MindIO
    hs = sim.signals("hot-switch")
    assert hs[1]["t"] - hs[0]["t"] >= 0.9
    # notifyPrepareHotSwitch: every rank of the fault pod (node-b: ranks 2, 3), all type "1"
    assert hs[0]["faultRanks"] == [("2", "1"), ("3", "1")] and hs[0]["nodeRankIds"] == []
    job = cd.jobs.get(JOB)
    assert sorted({r.node for r in job.ranks}) == ["node-a", "node-c"]
    assert job.sub_healthy_strategy == "hotSwitch"


async def test_hot_switch_without_backup_stops_switch_and_degrades(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch", backupNodes=[])
    sim = await sims.start()
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "degrade-to-ignore")
    assert "no backup node" in d["reason"]
    # the stop-switch signal is queued just before the decision: the sim reads it a moment later
    await sim.wait_for(lambda ev: len(signals(sim)) >= 2, timeout_s=5)
    assert [s[1] for s in signals(sim)] == [("hot switch",), ("stop switch",)]
    assert cd.jobs.get(JOB).sub_healthy_strategy == "ignore"


async def test_hot_switch_unhealthy_backup_is_not_used(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch")
    await cd.center.upsert(Fault("noded", "node-c", "CPU", -1, "00000009", "SeparateFault"))
    await sims.start()
    await cd.center.upsert(sub())
    await wait_decision(cd, "degrade-to-ignore")


async def test_hot_switch_resume_failure_stops_the_job(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch")
    sim = await sims.start(strategies=["migration"], status={"migration": 406})
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "kill-job")
    assert "resume failed (406)" in d["reason"]
    await sim.wait_for(lambda ev: sim.signals("killMaster"))
    assert cd.jobs.get(JOB).sub_healthy_strategy == "ignore"
    assert {r.node for r in cd.jobs.get(JOB).ranks} == {"node-a", "node-b"}  # not moved


async def test_hot_switch_pause_report_timeout_degrades(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch")
    await sims.start(strategies=None)
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "kill-job")
    assert "pause not reported in time" in d["reason"]
    assert "degrade-to-ignore" in decisions(cd)


async def test_hot_switch_exit_only_stops_the_job(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch")
    await sims.start(strategies=["exit"])
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "kill-job")
    assert "can only exit" in d["reason"]


async def test_hot_switch_not_on_the_master_pod(cd, sims):
    """The reference's skipHandleSubHealthyHotSwitch: a fault only on the master pod is skipped and the
    strategy kept (before: degraded to ignore), so a later fault on another pod still switches."""
    await apply(cd, subHealthyStrategy="hotSwitch")
    sim = await sims.start()
    await cd.center.upsert(sub(node="node-a"))
    d = await wait_decision(cd, "ignore")
    assert d["reason"] == "the fault is on the master pod (pod rank 0)"
    assert signals(sim) == []
    await cd.center.upsert(sub(node="node-b"))
    d = await wait_decision(cd, "start")
    assert d["flow"] == "hot-switch" and cd.jobs.get(JOB).sub_healthy_strategy == "hotSwitch"


async def test_hot_switch_framework_fallback(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch", framework="tensorflow")
    await sims.start()
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "ignore")
    assert "does not support hot switch" in d["reason"]


async def test_unhealthy_fault_with_hot_switch_runs_process_recovery(cd, sims):
    await apply(cd, subHealthyStrategy="hotSwitch")
    sim = await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "recover-success")
    assert sim.signals("stopTrain")


async def test_grace_exit_dump_failure_still_exits(cd, sims):
    await apply(cd, subHealthyStrategy="graceExit", recover_strategy="dump")
    sim = await sims.start(status={"dump": 499})
    await cd.center.upsert(sub())
    await wait_decision(cd, "exit-completed", timeout_s=5)
    assert decisions(cd) == ["pre-exit", "stop-train", "dump", "dump-failed", "exit-completed"]
    assert sim.signals("changeStrategy")[-1]["extraParams"] == "dump_exit"


async def test_grace_exit_dump_timeout_goes_to_fault_retry(cd, sims):
    # reference: WaitReportDumpStatus timeout -> FaultClear -> FaultRetry (not a kill)
    await apply(cd, subHealthyStrategy="graceExit", recover_strategy="dump")
    await sims.start(status={"dump": "silent"})
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "fault-clear")
    assert d["reason"] == "dump timed out"
    await wait_decision(cd, "fault-retry")
    assert "kill-job" not in decisions(cd)


async def test_grace_exit_only_for_dump_only_jobs(cd, sims):
    # reference skipHandleSubHealthyFaults: sub-health + graceExit is skipped unless dump is the only strategy
    await apply(cd, subHealthyStrategy="graceExit")  # retry,recover,dump
    sim = await sims.start()
    await cd.center.upsert(sub())
    d = await wait_decision(cd, "ignore")
    assert d["flow"] == "grace-exit" and "dump as the only strategy" in d["reason"]
    await asyncio.sleep(0.2)
    assert not sim.signals()


async def test_node_pre_separate_fault_makes_no_job_fault(cd, sims):
    # reference: a NodeD PreSeparateFault (e.g. iBMC 0800004B) creates no job fault: no graceExit, no flow
    await apply(cd, subHealthyStrategy="graceExit", recover_strategy="dump")
    sim = await sims.start()
    f = npu_fault(code="0800004B", level="PreSeparateFault", source="noded")
    await cd.center.upsert(replace(f, device_type="Memory", device_id=-1))
    await asyncio.sleep(0.3)
    assert decisions(cd) == [] and not sim.signals()
    assert cd.brain.job_view(cd.jobs.get(JOB))["health"] == "Healthy"


async def test_sub_health_fault_on_an_unhealthy_job_starts_nothing(cd, sims):
    # e.g. FD-OL's slow-node 110001010 (SubHealthFault) on a job that is already UnHealthy: not a
    # "hardware fault" recovery of the slow ranks
    await apply(cd, subHealthyStrategy="graceExit", recover_strategy="dump")
    sim = await sims.start(process_fault="silent")  # TaskD never reports: the job stays UnHealthy
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "pre-exit")
    before = decisions(cd)
    await cd.center.upsert(sub(node="node-a", dev=1))
    await asyncio.sleep(0.3)
    assert decisions(cd) == before and [s[0] for s in signals(sim)] == ["preExitProcess"]


def test_hot_switch_skip_rules_follow_the_reference():
    """skipHandleSubHealthyHotSwitch: which faults degrade the strategy, which are only skipped, and
    that only the first fault pod (master pod left out) is switched."""
    from types import SimpleNamespace

    from clusterd.brain.faultview import RankFault
    from clusterd.brain.intake import MAX_HOT_SWITCH_PODS, FaultIntake

    def rf(pod, rank):
        return RankFault(rank, f"node-{pod}", 0, pod, "80818C06", "SubHealthFault", "1", 0)

    job = SimpleNamespace(framework="pytorch")
    idle = SimpleNamespace(busy=lambda: False, state="INIT")
    rule = FaultIntake._hot_switch_faults
    why, degrade, faults = rule(job, idle, [rf(0, 0), rf(2, 4), rf(1, 2), rf(2, 5)])
    assert (why, degrade, [f.rank for f in faults]) == (None, False, [2])  # pod 1 only, master left out
    assert rule(job, idle, [rf(0, 0)])[:2] == ("the fault is on the master pod (pod rank 0)", False)
    busy = SimpleNamespace(busy=lambda: True, state="WaitReportStopComplete")
    assert rule(job, busy, [rf(1, 2)])[:2] == ("controller busy (WaitReportStopComplete)", False)
    many = [rf(p, p * 2) for p in range(1, MAX_HOT_SWITCH_PODS + 2)]
    assert rule(job, idle, many)[1] is True
    assert rule(SimpleNamespace(framework="tensorflow"), idle, [rf(1, 2)])[1] is True
