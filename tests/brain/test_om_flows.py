"""NIC switch (clusterd.md §4.1) and online stress test (§4.2) driven by trainsim."""

from __future__ import annotations

import asyncio

import pytest
from brain.brainkit import JOB, apply, decisions, npu_fault, wait_decision, wait_idle

from faultmesh._pb import recover_pb2 as pb
from faultmesh._pb import recover_pb2_grpc


@pytest.fixture
def stub(channel):
    return recover_pb2_grpc.RecoverStub(channel)


async def switch(stub, node="node-b", devs=("0", "1"), ops=(True, False)) -> str:
    r = await stub.SwitchNicTrack(
        pb.SwitchNics(jobID=JOB, nicOps={node: pb.DeviceList(dev=list(devs), op=list(ops))})
    )
    assert r.code == 0, r
    reply = await asyncio.wait_for(stub.SubscribeSwitchNicSignal(pb.SwitchNicRequest(jobID=JOB)).read(), 10)
    return reply.msg


async def test_switch_nic_happy(cd, stub, sims):
    await apply(cd)
    sim = await sims.start()
    msg = await switch(stub)
    assert msg == "switch nic finish"
    ev = await sim.wait_for(lambda ev: [e for e in ev if e["event"] == "switch"])
    assert (ev[0]["ranks"], ev[0]["ops"]) == (["2", "3"], [True, False])
    await wait_idle(cd)
    kinds = [(s["signalType"], s["actions"], s["changeStrategy"]) for s in sim.signals()]
    assert kinds == [("stopTrain", ["pause_train"], ""), ("changeStrategy", ["change_strategy"], "continue")]
    assert decisions(cd) == ["start", "switch-nic-success"]


async def test_switch_nic_failure_runs_normal_recovery(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(switch="fail")
    msg = await switch(stub)
    assert msg == "switch nic failed, switch nic failed"
    await wait_decision(cd, "recover-success")
    stops = sim.signals("stopTrain")
    assert [s["actions"] for s in stops] == [["pause_train"], ["stop_train"]]
    assert sorted(r for r, _ in stops[1]["faultRanks"]) == ["2", "3"]


async def test_switch_nic_result_timeout_runs_normal_recovery(cd, stub, sims):
    await apply(cd)
    await sims.start(switch="silent")
    msg = await switch(stub)
    assert msg == "switch nic failed, switch nic timeout"
    await wait_decision(cd, "recover-success")


async def test_fault_406_during_switch_runs_normal_recovery(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(switch="silent")
    r = await stub.SwitchNicTrack(
        pb.SwitchNics(jobID=JOB, nicOps={"node-a": pb.DeviceList(dev=["1"], op=[True])})
    )
    assert r.code == 0
    await sim.wait_for(lambda ev: [e for e in ev if e["event"] == "switch"])
    await asyncio.sleep(0.05)
    assert await sim.report_status(406) == 0
    reply = await stub.SubscribeSwitchNicSignal(pb.SwitchNicRequest(jobID=JOB)).read()
    assert reply.msg == "switch nic failed, recv fault, when switching nic"
    await wait_decision(cd, "recover-success")


async def test_pause_timeout_kills_the_job(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(stop="silent")
    msg = await switch(stub)
    assert msg == "pause train timeout"
    await sim.wait_for(lambda ev: sim.signals("killMaster"))
    await wait_idle(cd)
    # the next operation is accepted again: no stuck state machine
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))
    assert r.code == 0


async def test_pause_failed_499_kills_the_job(cd, stub, sims):
    await apply(cd)
    await sims.start(stop="fail")
    assert await switch(stub) == "pause train failed"
    await wait_decision(cd, "kill-job")


async def test_continue_failure_kills_the_job(cd, stub, sims):
    await apply(cd)
    await sims.start(status={"continue": 499})
    assert await switch(stub) == "continue train failed"
    await wait_decision(cd, "kill-job")


async def stress(stub, **kw) -> str:
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, **kw))
    assert r.code == 0, r
    reply = await asyncio.wait_for(
        stub.SubscribeStressTestResponse(pb.StressTestRequest(jobID=JOB)).read(), 10
    )
    return reply.msg


async def test_stress_test_happy(cd, stub, sims):
    await apply(cd)
    sim = await sims.start()
    msg = await stress(stub, stressParam={"node-b": pb.StressOpList(ops=[0, 1])})
    assert msg.startswith("stress test finish, result:")
    # the reference marshals each device's StressTestRankResult: its rankResult level is kept
    assert '"node-b":{"0":{"rankResult":{"0":{"code":"0"' in msg
    ev = await sim.wait_for(lambda ev: [e for e in ev if e["event"] == "stress"])
    assert ev[0]["params"] == {"2": [0, 1], "3": [0, 1]}
    await wait_idle(cd)
    kinds = [(s["signalType"], s["actions"]) for s in sim.signals()]
    assert kinds == [
        ("stopTrain", ["pause_train"]),
        ("pauseStartAgent", ["pause_start_agent"]),
        ("continueStartAgent", ["continue_start_agent"]),
        ("changeStrategy", ["change_strategy"]),
    ]
    assert sim.signals("stopTrain")[0]["timeout"] == 900


async def test_stress_code_2_isolates_the_node(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(stress_codes={"2": "2"})
    msg = await stress(stub, allNodesOps=[0])
    assert msg.startswith("stress test find fault, isolate node:['node-b'],result:{")  # + the results
    await wait_decision(cd, "recover-success")
    iso = [f for f in cd.center.faults("node-b") if f.source == "brain:stress-test"]
    assert iso and iso[0].level == "SeparateFault" and iso[0].attributes["NodeHealthyStatus"] == "UnHealthy"
    stop = sim.signals("stopTrain")[-1]
    assert stop["actions"] == ["stop_train"] and sorted(r for r, _ in stop["faultRanks"]) == ["2", "3"]


async def test_stress_code_3_makes_a_rank_fault(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(stress_codes={"1": "3"})
    msg = await stress(stub, allNodesOps=[1])
    assert msg.startswith("stress test timeout fault, faultRank:[1],result:{")
    await wait_decision(cd, "recover-success")
    assert sim.signals("stopTrain")[-1]["faultRanks"] == [("1", "1")]


async def test_stress_result_timeout_runs_recovery(cd, stub, sims):
    await apply(cd)
    await sims.start(stress_code="silent")
    assert await stress(stub, allNodesOps=[0]) == "stress test timeout"
    await wait_decision(cd, "recover-success")


async def test_stress_codes_hidden_during_the_test(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(delay_s=0.4)
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, stressParam={"node-b": pb.StressOpList(ops=[0])}))
    assert r.code == 0
    await sim.wait_for(lambda ev: sim.signals("pauseStartAgent"))
    await cd.center.upsert(npu_fault(code="80818C05", level="RestartNPU"))
    job = cd.jobs.get(JOB)
    assert cd.brain.rank_faults(job) == []  # hidden while the test runs
    assert cd.brain.fault.job_nodes(job) == []
    await wait_decision(cd, "stress-test-success")
    assert "stop-train" not in decisions(cd)
    assert [f.code for f in cd.brain.rank_faults(job)] == ["80818C05"]  # visible again afterwards


async def test_stress_fault_406_marks_the_test(cd, stub, sims):
    await apply(cd)
    sim = await sims.start(stress_code="silent")
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))
    assert r.code == 0
    await sim.wait_for(lambda ev: sim.signals("pauseStartAgent"))
    assert await sim.report_status(406) == 0
    reply = await stub.SubscribeStressTestResponse(pb.StressTestRequest(jobID=JOB)).read()
    assert reply.msg == "recv fault, when stressing test"
    await wait_decision(cd, "recover-success")  # the result never came: timeout -> recovery


async def test_two_operators_racing(cd, stub, sims):
    await apply(cd)
    await sims.start(delay_s=0.2)
    a, b = await asyncio.gather(
        stub.SwitchNicTrack(pb.SwitchNics(jobID=JOB, nicOps={"node-a": pb.DeviceList(dev=["0"], op=[True])})),
        stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0])),
    )
    assert sorted([a.code, b.code]) == [0, 411]
    await wait_idle(cd)


async def test_hardware_fault_while_idle_after_om(cd, stub, sims):
    await apply(cd)
    await sims.start()
    assert await switch(stub) == "switch nic finish"
    await wait_idle(cd)
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "recover-success")


async def test_stress_test_after_a_recovery_on_the_same_client(cd, stub, sims):
    # a pause (stopTrain pause_train) starts a new uuid: the O&M signals after it carry that one
    await apply(cd)
    sim = await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "recover-success")
    await wait_idle(cd)
    msg = await stress(stub, stressParam={"node-b": pb.StressOpList(ops=[0])})
    assert msg.startswith("stress test finish, result:")
    await wait_decision(cd, "stress-test-success")
    assert sim.errors == []
