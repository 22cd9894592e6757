"""Recover RPCs: ReportProcessFault, the NIC-switch and stress-test RPCs' codes (clusterd.md §2.1,
§4); the control RPCs' codes are in tests/conformance/test_recover_service.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from brain.brainkit import JOB, apply, npu_fault, wait_decision

from faultmesh._pb import recover_pb2 as pb
from faultmesh._pb import recover_pb2_grpc


@pytest.fixture
def stub(channel):
    return recover_pb2_grpc.RecoverStub(channel)


def ci(job=JOB):
    return pb.ClientInfo(jobId=job, role="taskd")


async def registered(cd, stub, **over):
    await apply(cd, **over)
    assert (await stub.Init(ci())).code == 0
    assert (await stub.Register(ci())).code == 0


# Init / Register / SubscribeProcessManageSignal / Report* / HealthCheck codes and info strings:
# tests/conformance/test_recover_service.py


async def test_report_process_fault_starts_recovery(cd, stub, sims):
    await apply(cd)
    sim = await sims.start()
    assert await sim.report_process_fault([("3", "1")]) == 0
    d = await wait_decision(cd, "stop-train")
    assert d["reason"] == "the training side reported a process fault" and d["faults"][0]["rank"] == 3
    await wait_decision(cd, "recover-success")


def nic(**nodes):
    return pb.SwitchNics(jobID=JOB, nicOps={n: pb.DeviceList(dev=d, op=o) for n, (d, o) in nodes.items()})


async def test_switch_nic_track_codes(cd, stub):
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["0"], [True])}))
    assert (r.code, r.info) == (413, f"job {JOB} not found")
    await apply(cd)
    assert "not registered" in (await stub.SwitchNicTrack(nic(**{"node-a": (["0"], [True])}))).info
    await stub.Init(ci())
    await stub.Register(ci())
    cases = [
        (nic(), "nicOps is empty"),
        (nic(**{"node-x": (["0"], [True])}), "not in the job's server list"),
        (nic(**{"node-a": (["0", "1"], [True])}), "equal length"),
        (nic(**{"node-a": ([], [])}), "non-empty"),
        (nic(**{"node-a": (["0", "0"], [True, False])}), "duplicate"),
        (nic(**{"node-a": (["5"], [True])}), "not the job's devices"),
    ]
    for req, why in cases:
        r = await stub.SwitchNicTrack(req)
        assert r.code == 413 and why in r.info, (r, why)
    spec_ranks = [dict(r, superPodId=-1) for r in cd.jobs.get(JOB).to_dict()["ranks"]]
    await apply(cd, ranks=spec_ranks)
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["0"], [True])}))
    assert r.code == 413 and "SuperPoD" in r.info
    await apply(cd, status="pending")
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["0"], [True])}))
    assert r.code == 413 and "not running" in r.info


async def test_om_411_while_a_flow_runs_and_0_otherwise(cd, stub, sims):
    await apply(cd)
    await sims.start(job_id=JOB, stop="silent")  # pause is never confirmed: the flow stays busy
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["0"], [True])}))
    assert (r.code, r.info) == (0, "switching operation was successfully distributed")
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["1"], [True])}))
    assert (r.code, r.info) == (411, "nic is swtiching, or job recovering")
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))
    assert r.code == 411


async def test_stress_test_codes(cd, stub):
    assert (await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))).code == 413
    await registered(cd, stub)
    sp = pb.StressOpList
    cases = [
        (pb.StressTestParam(jobID=JOB), "both empty"),
        (pb.StressTestParam(jobID=JOB, allNodesOps=[0, 2]), "must be 0 (AIC) or 1 (P2P)"),
        (pb.StressTestParam(jobID=JOB, allNodesOps=[1, 1]), "duplicate"),
        (pb.StressTestParam(jobID=JOB, stressParam={"node-a": sp(ops=[])}), "ops is empty"),
        (pb.StressTestParam(jobID=JOB, stressParam={"node-x": sp(ops=[0])}), "not in the job"),
        (pb.StressTestParam(jobID=JOB, stressParam={"node-a": sp(ops=[0, 0])}), "duplicate"),
    ]
    for req, why in cases:
        r = await stub.StressTest(req)
        assert r.code == 413 and why in r.info, (r, why)


async def test_om_reply_streams_need_an_operation(cd, stub):
    await registered(cd, stub)
    for call in (
        stub.SubscribeSwitchNicSignal(pb.SwitchNicRequest(jobID=JOB)),
        stub.SubscribeStressTestResponse(pb.StressTestRequest(jobID=JOB)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
        assert "no active" in e.value.details()


async def test_token_required_when_configured(tmp_path):
    from support import make_clusterd

    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    cd = await make_clusterd(tmp_path, "--token-file", str(tok))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            stub = recover_pb2_grpc.RecoverStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Init(ci())
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            r = await stub.Init(ci(), metadata=(("authorization", "Bearer s3cret"),))
            assert r.code == 502
            assert (await stub.HealthCheck(ci())).code == 0  # read-only, no token
    finally:
        await cd.stop()


async def test_unregistered_job_fault_is_still_decided(cd):
    await apply(cd)
    await cd.center.upsert(npu_fault())
    d = await wait_decision(cd, "job-rescheduling")
    assert "no process-recovery client" in d["reason"] and d["faults"][0]["rank"] == 2
    await asyncio.sleep(0.05)


async def test_report_504_when_the_slot_stays_busy(cd, stub):
    await registered(cd, stub)
    ctl = cd.brain.controllers[JOB]
    ctl.expect("stop")  # a flow waits for a stop report but does not take it
    req = pb.StopCompleteRequest(jobId=JOB)
    assert (await stub.ReportStopComplete(req)).code == 0  # fills the 1-slot channel
    r = await stub.ReportStopComplete(req)
    assert (r.code, r.info) == (504, "report queue busy")
