"""The recovery state machine (clusterd.md §7.3) driven by trainsim: happy, failure and timeout paths."""

from __future__ import annotations

import asyncio
import json

import grpc
from brain.brainkit import (
    JOB,
    apply,
    decisions,
    expect_stop_train_dropped,
    npu_fault,
    signals,
    stuck_at_stop_complete,
    wait_decision,
    wait_idle,
)

from faultmesh._pb import recover_pb2 as pb
from faultmesh._pb import recover_pb2_grpc


async def test_recover_happy_path(cd, sims):
    await apply(cd)
    sim = await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "recover-success")
    await wait_idle(cd)
    # reference §7.2: a non-retry hardware fault -> preExitProcess, TaskD's ReportProcessFault -> stopTrain
    assert decisions(cd) == ["pre-exit", "stop-train", "recover", "recover-success"]
    from prometheus_client import generate_latest

    metrics = generate_latest(cd.registry).decode()
    assert 'faultmesh_brain_decisions_total{decision="recover-success",flow="recovery"} 1.0' in metrics
    assert 'faultmesh_brain_signals_total{signal="stopTrain"} 1.0' in metrics
    assert "faultmesh_brain_registered_jobs 1.0" in metrics
    assert signals(sim) == [
        ("preExitProcess", ("pre exit process",), ""),
        ("stopTrain", ("stop_train",), ""),
        ("globalFault", ("on_global_rank", "fault_nodes_exit"), ""),
        ("changeStrategy", ("change_strategy",), "recover"),
    ]
    pre = sim.signals("preExitProcess")[0]
    assert (pre["faultRanks"], pre["nodeRankIds"]) == ([("2", "1")], ["1"])
    assert any(e.get("rpc") == "ReportProcessFault" for e in sim.events)
    stop = sim.signals("stopTrain")[0]
    assert stop["faultRanks"] == [("2", "1")]
    gf = sim.signals("globalFault")[0]
    assert gf["nodeRankIds"] == ["1"]  # node-b hosts pod rank 1
    assert gf["faultRanks"] == [("2", "1"), ("3", "1")]  # every rank of the pod told to exit
    cs = sim.signals("changeStrategy")[0]
    assert (cs["faultRanks"], cs["nodeRankIds"]) == ([("2", "1"), ("3", "1")], ["1"])
    assert cs["uuid"] == stop["uuid"] == gf["uuid"] != pre["uuid"]
    assert (
        stop["uuid"].split("-")[0] == stop["uuid"].split("-")[0].upper()
        and len(stop["uuid"].split("-")[1]) == 32
    )
    assert cd.brain.controllers[JOB].state == "INIT"


async def test_retry_only_uce_then_retry_fails_405_and_recover_takes_over(cd, sims):
    await apply(cd)
    sim = await sims.start(status={"retry": 405})
    await cd.center.upsert(npu_fault(code="80E01801", level="RestartBusiness"))
    await wait_decision(cd, "recover-success")
    assert decisions(cd) == ["stop-train", "retry", "retry-failed", "recover", "recover-success"]
    gf = sim.signals("globalFault")[0]
    assert gf["actions"] == ["on_global_rank"] and gf["faultRanks"] == [("2", "0")] and gf["timeout"] == 0
    assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["retry", "recover"]
    retry = sim.signals("changeStrategy")[0]
    assert (retry["faultRanks"], retry["nodeRankIds"]) == ([("2", "0")], ["1"])
    # reference: 405 -> WaitFaultFlushFinished -> globalFault fault_nodes_exit (faults now normal, every
    # rank of the pod) -> a new ReportRecoverStrategy -> the strategy chosen after a retry failure
    assert len(sim.signals("globalFault")) == 2
    again = sim.signals("globalFault")[1]
    assert again["actions"] == ["on_global_rank", "fault_nodes_exit"]
    assert (again["faultRanks"], again["nodeRankIds"]) == ([("2", "1"), ("3", "1")], ["1"])
    assert sum(e.get("rpc") == "ReportRecoverStrategy" for e in sim.events) == 2


async def test_hccl_retry_fault_gets_33s_timeout(cd, sims):
    await apply(cd)
    sim = await sims.start()
    await cd.center.upsert(npu_fault(code="8C1F860B", level="RestartBusiness"))
    await wait_decision(cd, "retry-success")
    assert sim.signals("globalFault")[0]["timeout"] == 33


async def test_recover_fails_then_dump_then_exit(cd, sims):
    await apply(cd)
    sim = await sims.start(status={"recover": 406})
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "exit-completed")
    await wait_idle(cd)
    assert decisions(cd) == [
        "pre-exit",
        "stop-train",
        "recover",
        "recover-failed",
        "dump",
        "dump-success",
        "exit-completed",
    ]
    await sim_saw_dump_exit(sim)
    last = sim.signals("changeStrategy")[-1]
    assert (last["changeStrategy"], last["extraParams"]) == ("exit", "dump_exit")
    assert (last["faultRanks"], last["nodeRankIds"]) == ([], ["1"])  # sendDumpExit: the fault pods
    dump = sim.signals("changeStrategy")[-2]
    assert (dump["changeStrategy"], dump["faultRanks"], dump["nodeRankIds"]) == (
        "dump",
        [("2", "1"), ("3", "1")],
        ["1"],
    )
    assert "job-rescheduling restarts the job" in cd.brain.decisions[JOB][-1]["reason"]


async def test_only_exit_reported_goes_to_exit(cd, sims):
    await apply(cd)
    sim = await sims.start(strategies=["exit"])
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "exit")
    assert "recover not possible" in d["reason"]
    await wait_decision(cd, "exit-completed")
    await sim.wait_for(lambda ev: sim.signals("changeStrategy"))  # it may read the signal after the decision
    last = sim.signals("changeStrategy")[-1]
    assert last["changeStrategy"] == "exit" and last["nodeRankIds"] == ["1"]  # TaskD's ExitAgent targets


async def test_elastic_training_scale_in_then_out(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training"})
    sim = await sims.start(strategies=["downgrade", "exit"], status={"downgrade": 201})
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "scale-in-success")
    fne = sim.signals("faultNodesExit")[0]
    # MindIO isolates only the fault ranks: their pod (1) exited at the globalFault, none is left
    # (controller.go handleCheckScaleStrategyRecoverResult -> RemoveDuplicateNodeRanks)
    assert sim.signals("globalFault")[0]["nodeRankIds"] == ["1"] and fne["nodeRankIds"] == []
    assert json.loads(sim.signals("changeStrategy")[0]["extraParams"]) == {"scale-in-strategy": "DP"}
    await cd.center.remove(npu_fault().key)  # resources are back
    await wait_decision(cd, "scale-out-success")
    assert json.loads(sim.signals("changeStrategy")[-1]["extraParams"]) == {"scale-out-strategy": "DP"}


async def test_scale_in_exits_only_the_isolated_pods_that_are_no_fault_pods(cd, sims):
    # the reference's TestRemoveDuplicateNodeRanksWithDuplicates in a flow: MindIO isolates the
    # fault pod's DP group (ranks 2-5: pods 1 and 2); pod 1 exited at the globalFault already
    three = [{"rank": r, "node": f"node-{n}", "device": r % 2} for r, n in enumerate("aabbdd")]
    await apply(cd, ranks=three, **{"recover-strategy": "elastic-training"})
    sim = await sims.start(strategies=["downgrade", "exit"], status={"downgrade": "silent"})
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("changeStrategy"))
    rep = pb.RecoverStatusRequest(
        jobId=JOB, status=pb.Status(code=201), strategy="downgrade", isolateRankIds=["2", "3", "4", "5"]
    )
    assert await sim._send("ReportRecoverStatus", rep) == 0
    await wait_decision(cd, "scale-in-success")
    assert sim.signals("globalFault")[0]["nodeRankIds"] == ["1"]
    assert [s["nodeRankIds"] for s in sim.signals("faultNodesExit")] == [["2"]]


async def test_new_fault_during_scale_in_running_restarts_with_stop_train(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training"})
    sim = await sims.start(strategies=["downgrade", "exit"], status={"downgrade": 201})
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "scale-in-success")
    await cd.center.upsert(npu_fault(node="node-a", dev=1))  # a new fault while scaled in
    await wait_decision(cd, "exit-completed")  # pod rank 0 is faulty now: no elastic training
    assert "new fault during ScaleInRunning" in [x["reason"] for x in cd.brain.decisions[JOB]]
    assert len(sim.signals("stopTrain")) == 2


async def test_elastic_training_not_for_pod_rank_0(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training"})
    await sims.start(strategies=["downgrade", "exit"])
    await cd.center.upsert(npu_fault(node="node-a"))
    d = await wait_decision(cd, "exit")
    assert "elastic-training not possible" in d["reason"]


async def test_dump_only_strategy_sends_save_and_exit(cd, sims):
    await apply(cd, **{"recover-strategy": "dump"})
    sim = await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "exit-completed")
    assert [s[0] for s in signals(sim)][:2] == ["preExitProcess", "saveAndExit"]
    assert "stopTrain" not in [s[0] for s in signals(sim)]


async def test_stop_complete_timeout_clears_the_fault(cd, sims):
    await apply(cd)
    await sims.start(stop="silent")
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    assert "stop complete not reported in 2.0s" in d["reason"]
    await wait_idle(cd)
    assert cd.brain.controllers[JOB].state == "INIT"


async def test_stop_complete_404_kills_the_job(cd, sims):
    await apply(cd)
    sim = await sims.start(stop="notready")
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "kill-job")
    await sim.wait_for(lambda ev: sim.signals("killMaster"))
    assert sim.signals("killMaster")[0]["actions"] == []


async def test_strategy_not_reported_goes_to_fault_clear_and_retry(cd, sims):
    # reference: WaitReportRecoverStrategy timeout -> FaultClear -> FaultRetry (label pause, dump_exit,
    # job Running, label on) -> INIT; no killMaster
    await apply(cd)
    sim = await sims.start(strategies=None)
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    assert "recover strategy not reported" in d["reason"]
    await wait_decision(cd, "fault-retry")
    await wait_idle(cd)
    await sim_saw_dump_exit(sim)
    last = sim.signals("changeStrategy")[-1]
    assert (last["changeStrategy"], last["extraParams"], last["nodeRankIds"]) == ("exit", "dump_exit", ["1"])
    assert not sim.signals("killMaster") and cd.jobs.get(JOB).process_recover_enable == "on"


async def test_fault_retry_kills_a_job_that_does_not_run_again(cd, sims):
    await apply(cd)
    sim = await sims.start(strategies=None)
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("globalFault"))
    await cd.jobs.update(JOB, status="pending")  # the rescheduled job never runs
    d = await wait_decision(cd, "kill-job", timeout_s=8)
    assert "not running" in d["reason"]


async def test_status_silent_goes_to_fault_clear_and_retry(cd, sims):
    # reference: WaitReportProcessRecoverStatus timeout -> FaultClear -> FaultRetry (no other strategy)
    await apply(cd)
    await sims.start(status={"recover": "silent", "dump": "silent"})
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "fault-retry", timeout_s=15)
    assert decisions(cd) == ["pre-exit", "stop-train", "recover", "fault-clear", "fault-retry"]
    assert cd.brain.decisions[JOB][3]["reason"] == "no recover status reported in 2.0s"


async def test_client_vanishing_mid_flow_resets_the_controller(cd, sims):
    await apply(cd)
    sim = await sims.start(stop="silent")
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("stopTrain"))
    await sim.close()  # the training side disappears
    d = await wait_decision(cd, "reset")
    assert d["reason"] == "signal stream ended"
    assert cd.brain.controllers[JOB].state == "INIT" and not cd.brain.controllers[JOB].busy()


async def test_new_subscription_resets_and_ends_the_old_stream(cd, sims, target):
    await apply(cd)
    first = await sims.start(stop="silent")
    await cd.center.upsert(npu_fault())
    await first.wait_for(lambda ev: first.signals("stopTrain"))
    async with grpc.aio.insecure_channel(target) as ch:
        call = recover_pb2_grpc.RecoverStub(ch).SubscribeProcessManageSignal(pb.ClientInfo(jobId=JOB))
        sig = await asyncio.wait_for(call.read(), 5)
        assert sig.signalType == "keep-alive"
        await first.wait_for(lambda ev: any(e["event"] == "stream-ended" for e in ev))
        assert "reset" in decisions(cd)
        call.cancel()


async def test_keep_alive_every_period(cd, sims):
    await apply(cd)
    sim = await sims.start()
    await sim.wait_for(lambda ev: sum(e["event"] == "keep-alive" for e in ev) >= 2, timeout_s=3)


async def test_fault_during_flow_joins_cached_faults(cd, sims):
    await apply(cd)
    sim = await sims.start(delay_s=0.2)
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("stopTrain"))
    await cd.center.upsert(npu_fault(node="node-a", dev=1))
    await wait_decision(cd, "recover-success")
    gf = sim.signals("globalFault")[0]
    assert sorted(r for r, _ in gf["faultRanks"]) == ["0", "1", "2", "3"]  # both pods, every rank
    assert gf["nodeRankIds"] == ["0", "1"]
    assert decisions(cd).count("stop-train") == 1
    pre = sim.signals("preExitProcess")
    assert [p["faultRanks"] for p in pre] == [[("2", "1")], [("1", "1")]]  # idle, then joined
    assert pre[-1]["actions"] == ["pre exit process"] and pre[-1]["nodeRankIds"] == ["0"]


async def test_a_fault_during_a_flow_sends_its_pre_exit_after_the_global_fault(cd, sims):
    # TaskD's stop-train plugin (stop_train.go) holds the flow's stopTrain until a globalFault /
    # changeStrategy; a preExitProcess before that releases it without forgetting, and TaskD then
    # drops the *next* flow's stopTrain (trainsim's check; the reference sends the preExit at once
    # and its next flow waits 15 min for ReportStopComplete). faultmesh holds the mid-flow preExit
    # until the globalFault is out, and the next flow's stopTrain reaches TaskD.
    await apply(cd)
    sim = await sims.start(delay_s=0.2)
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("stopTrain"))
    await cd.center.upsert(npu_fault(node="node-a", dev=1))  # during the flow
    await wait_decision(cd, "recover-success")
    await wait_idle(cd)
    order = [s[0] for s in signals(sim)]
    assert order[:3] == ["preExitProcess", "stopTrain", "globalFault"]
    assert order.index("preExitProcess", 1) > order.index("globalFault")
    await cd.center.upsert(npu_fault(node="node-a", dev=0, code="80E18403"))  # the next flow
    async with asyncio.timeout(10):
        while decisions(cd).count("recover-success") < 2:
            await asyncio.sleep(0.02)
    assert len(sim.signals("stopTrain")) == 2 and "fault-clear" not in decisions(cd)
    assert sim.errors == []


async def test_recovery_endpoint_lists_decisions(cd, sims):
    import urllib.request

    await apply(cd)
    await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "recover-success")
    url = f"http://{cd.http.host}:{cd.http.port}/v1/jobs/{JOB}/recovery"
    body = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(url, timeout=5).read()))
    assert body["registered"] and body["subscribed"]
    assert [d["decision"] for d in body["decisions"]] == [
        "pre-exit",
        "stop-train",
        "recover",
        "recover-success",
    ]
    assert body["decisions"][2]["reason"] == "recover is configured and reported"
    # persisted: a restarted brain still answers
    assert [d["decision"] for d in await cd.store.kv_get("decisions", JOB)][-1] == "recover-success"


async def sim_saw_dump_exit(sim) -> None:
    """The dump_exit changeStrategy is sent with no report to wait for: clusterd decides on its delivery
    to the stream, the sim records it once read off the wire (later, on a loaded box)."""
    await sim.wait_for(
        lambda ev: any(s.get("extraParams") == "dump_exit" for s in sim.signals("changeStrategy"))
    )


async def test_dump_failure_exits_once(cd, sims):
    await apply(cd)
    sim = await sims.start(strategies=["dump", "exit"], status={"dump": 499})
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "exit-completed")
    await wait_idle(cd)
    assert decisions(cd) == ["pre-exit", "stop-train", "dump", "dump-failed", "exit-completed"]
    await sim_saw_dump_exit(sim)
    assert [s["changeStrategy"] for s in sim.signals("changeStrategy")] == ["dump", "exit"]


async def test_out_of_order_report_is_dropped_and_the_flow_goes_on(cd, sims):
    await apply(cd)
    sim = await sims.start(stop="silent")
    await cd.center.upsert(npu_fault())
    await sim.wait_for(lambda ev: sim.signals("stopTrain"))
    ctl = cd.brain.controllers[JOB]
    assert await sim.report_status(0, "recover") == 0  # not what the flow waits for
    assert ctl.state == "WaitReportStopComplete"
    from prometheus_client import generate_latest

    assert (
        'faultmesh_rejected_requests_total{reason="order_mix",service="brain"} 1.0'
        in generate_latest(cd.registry).decode()
    )
    await wait_decision(cd, "fault-clear")  # the wait still ends by its own timeout


async def test_jobs_and_decisions_survive_a_restart(tmp_path):
    from brain.brainkit import FAST
    from support import make_clusterd

    cd = await make_clusterd(tmp_path, *FAST)
    try:
        await apply(cd)
        await cd.center.upsert(npu_fault())  # no client: a job-level decision
        await wait_decision(cd, "job-rescheduling")
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path, *FAST)
    try:
        assert cd.jobs.get(JOB).ranks[2].node == "node-b"
        assert decisions(cd) == ["job-rescheduling"]
    finally:
        await cd.stop()


async def test_trainsim_reregisters_after_a_clusterd_restart(tmp_path):
    from brain.brainkit import FAST
    from support import free_port, make_clusterd

    from fmtools.trainsim import TrainSim

    port = free_port()
    cd = await make_clusterd(tmp_path, *FAST, "--grpc-addr", f"127.0.0.1:{port}")
    sim = TrainSim(f"127.0.0.1:{port}", JOB, reconnect=True)
    task = None
    try:
        await apply(cd)
        ready = asyncio.Event()
        task = asyncio.create_task(sim.run(ready))
        await asyncio.wait_for(ready.wait(), 5)
        await cd.stop()
        cd = await make_clusterd(tmp_path, *FAST, "--grpc-addr", f"127.0.0.1:{port}")
        async with asyncio.timeout(15):
            while not (JOB in cd.brain.controllers and cd.brain.controllers[JOB].subscribed):
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        await cd.center.upsert(npu_fault())
        await wait_decision(cd, "recover-success")
        assert any(e["event"] == "reconnecting" for e in sim.events)
    finally:
        sim.stop()
        if task is not None:
            await asyncio.wait_for(task, 10)
        await cd.stop()


async def test_elastic_training_failure_and_timeout_fall_back_to_dump(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training,dump"})
    await sims.start(strategies=["downgrade", "dump", "exit"], status={"downgrade": 406})
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "exit-completed")
    # fault-scheduling=grace: the resource wait (MINDIO_WAIT_MINDX_TIME - 10 s) comes first
    assert decisions(cd)[2:6] == ["elastic-wait", "elastic-training", "elastic-training-failed", "dump"]


async def test_elastic_training_status_timeout_goes_to_fault_retry(cd, sims):
    await apply(cd, **{"recover-strategy": "elastic-training"})
    await sims.start(strategies=["downgrade", "exit"], status={"downgrade": "silent"})
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "fault-clear")
    assert d["reason"] == "no elastic-training status reported in 2.0s"
    await wait_decision(cd, "fault-retry")


async def test_operator_reset_clears_a_stuck_flow_and_can_reevaluate(cd, sims):
    import urllib.request

    await apply(cd)
    ctl = await stuck_at_stop_complete(cd, sims)
    url = f"http://{cd.http.host}:{cd.http.port}/v1/jobs/{JOB}/recovery/reset"

    def post(body: bytes) -> dict:
        req = urllib.request.Request(url, data=body, method="POST")
        return json.loads(urllib.request.urlopen(req, timeout=5).read())

    out = await asyncio.to_thread(post, b"")
    assert (out["result"], out["was"], out["state"]) == ("reset", "WaitReportStopComplete", "INIT")
    assert not ctl.busy() and not ctl.cached_faults
    assert decisions(cd)[-1] == "operator-reset"
    await asyncio.to_thread(post, b'{"reevaluate": true}')  # the still-active fault acts again
    async with asyncio.timeout(5):
        while decisions(cd).count("pre-exit") < 2:
            await asyncio.sleep(0.02)
    # the real TaskD forwarded the reset flow's stopTrain and saw no globalFault / changeStrategy
    # since: it drops the new flow's stopTrain (docs/compatibility.md, Operator undo)
    await expect_stop_train_dropped(sims.running[-1][0])
