"""Recover-in-place (clusterd.md §6.2, §7.3 step 3): the 15 s wait for the faults to vanish and the
per-pod split into pods that restart their processes and pods that restart as pods."""

from __future__ import annotations

from brain.brainkit import JOB, apply, decisions, npu_fault, vanish_in, wait_decision, wait_idle, wait_state

IN_PLACE = {"recover-strategy": "recover-in-place,recover,dump"}


def rb(node="node-b", dev=0):
    return npu_fault(node=node, dev=dev, code="80C98000", level="RestartBusiness")


async def _vanish_during_the_wait(cd, fault) -> None:
    await wait_state(cd, "WaitFaultDisappear")
    await cd.center.remove(fault.key)


async def test_fault_vanishing_within_the_wait_restarts_processes_in_place(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "dump", "exit"])
    await cd.center.upsert(rb())
    await _vanish_during_the_wait(cd, rb())
    await wait_decision(cd, "recover-in-place-success")
    split = next(d for d in cd.brain.decisions[JOB] if d["decision"] == "in-place-split")
    assert split["reason"] == "restart processes on pods [1], restart pods []"
    gf = sim.signals("globalFault")[0]
    # the reference: fault_nodes_exit, nodeRankIds = the pods that restart as pods (none here); the
    # restarting pod keeps its own fault ranks only
    assert (gf["actions"], gf["nodeRankIds"], gf["faultRanks"]) == (
        ["on_global_rank", "fault_nodes_exit"], [], [("2", "1")]
    )  # fmt: skip
    cs = sim.signals("changeStrategy")[0]
    assert (cs["changeStrategy"], cs["extraParams"], cs["actions"]) == (
        "recover", "recover-in-place", ["change_strategy", "fault_nodes_restart"]
    )  # fmt: skip
    assert (cs["faultRanks"], cs["nodeRankIds"]) == ([("2", "1")], ["1"])  # TaskD restarts pod 1's workers


async def test_fault_still_present_after_the_wait_restarts_the_pod(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "dump", "exit"])
    await cd.center.upsert(rb())
    await wait_decision(cd, "recover-success")
    await wait_idle(cd)
    split = next(d for d in cd.brain.decisions[JOB] if d["decision"] == "in-place-split")
    assert (
        split["reason"] == "restart processes on pods [], restart pods [1] (faults still present after 0.6s)"
    )
    assert decisions(cd)[-2:] == ["recover", "recover-success"]
    gf = sim.signals("globalFault")[0]
    assert (gf["nodeRankIds"], gf["faultRanks"]) == (["1"], [("2", "1"), ("3", "1")])
    cs = sim.signals("changeStrategy")[0]
    assert (cs["changeStrategy"], cs["extraParams"], cs["nodeRankIds"]) == ("recover", "", ["1"])


async def test_per_pod_split_one_pod_in_place_one_pod_restarted(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "dump", "exit"])
    await cd.center.apply([rb("node-a", 1), rb("node-b", 0)], [], "t")
    await _vanish_during_the_wait(cd, rb("node-a", 1))  # pod 0's fault goes, pod 1's stays
    await wait_decision(cd, "recover-in-place-success")
    gf = sim.signals("globalFault")[0]
    assert (gf["nodeRankIds"], gf["faultRanks"]) == (["1"], [("1", "1"), ("2", "1"), ("3", "1")])
    cs = sim.signals("changeStrategy")[0]
    assert (cs["nodeRankIds"], cs["faultRanks"]) == (["0"], [("1", "1"), ("2", "1"), ("3", "1")])


async def test_in_place_failure_falls_back_to_dump_restarting_every_pod(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "dump", "exit"], status={"recover": 406})
    await cd.center.upsert(rb())
    await _vanish_during_the_wait(cd, rb())
    await wait_decision(cd, "exit-completed")
    assert decisions(cd)[-5:] == [
        "recover-in-place", "recover-in-place-failed", "dump", "dump-success", "exit-completed"
    ]  # fmt: skip
    dump = next(s for s in sim.signals("changeStrategy") if s["changeStrategy"] == "dump")
    # handleRestartFaultProcess: another strategy -> every fault pod restarts as a pod
    assert (dump["actions"], dump["nodeRankIds"], dump["faultRanks"]) == (
        ["change_strategy", "fault_nodes_exit"], ["1"], [("2", "1"), ("3", "1")]
    )  # fmt: skip


async def test_in_place_status_timeout_goes_to_fault_retry(cd, sims):
    await apply(cd, **IN_PLACE)
    await sims.start(strategies=["recover", "exit"], status={"recover": "silent"})
    await cd.center.upsert(rb())
    await _vanish_during_the_wait(cd, rb())
    d = await wait_decision(cd, "fault-clear")
    assert d["reason"] == "no recover-in-place status reported in 2.0s"
    await wait_decision(cd, "fault-retry")


async def test_software_faults_on_two_pods_cannot_restart_in_place(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "exit"])
    assert await sim.report_process_fault([("1", "1"), ("2", "1")]) == 0
    await wait_decision(cd, "recover-success")
    assert "in-place-split" not in decisions(cd)
    assert sim.signals("globalFault")[0]["nodeRankIds"] == ["0", "1"]


async def test_client_vanishing_during_the_in_place_wait_resets(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "exit"])
    await cd.center.upsert(rb())
    ctl = await vanish_in(cd, sim, "WaitFaultDisappear")
    assert not ctl.restart_proc_pods


async def test_new_fault_during_the_in_place_wait_joins_as_a_pod_restart(cd, sims):
    await apply(cd, **IN_PLACE)
    sim = await sims.start(strategies=["recover", "dump", "exit"])
    await cd.center.upsert(rb())
    await wait_state(cd, "WaitFaultDisappear")
    await cd.center.upsert(npu_fault(node="node-a", dev=1))  # a RestartNPU fault races the wait
    await cd.center.remove(rb().key)
    await wait_decision(cd, "recover-in-place-success")
    await wait_idle(cd)
    gf = sim.signals("globalFault")[0]
    # pod 1 (its fault vanished) restarts processes; pod 0, faulty since the wait began, restarts as a pod
    assert (gf["nodeRankIds"], gf["faultRanks"]) == (["0"], [("0", "1"), ("1", "1"), ("2", "1")])
    assert sim.signals("changeStrategy")[0]["nodeRankIds"] == ["1"]
    assert decisions(cd).count("stop-train") == 1
