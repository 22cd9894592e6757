"""Recover: every control RPC's codes and info strings as the reference answers them.

Reference: component/clusterd/pkg/application/recover/fault_recover_service.go — Init (``getJobBaseInfo``:
502 OperatePodGroupError "job(uid=%s) one of jobName, pgName, ns is empty", 403 ProcessRecoverEnableOff
"job(uid=%s) process-recover-enable and subhealthy hotswtich not open:%v" with a nil error; 0
"job(uid=%s) init success", also when already initialised), Register (0 "register success" also
when registered; 408 UnInit "jobId=%s not inited"; ``preRegistry``: 402 JobNotExist "jobId=%s not
exist, reuse registry", 500 OutOfMaxServeJobs "out of max serve jobs, reuse registry for jobId=%s"),
SubscribeProcessManageSignal (error "jobId=%s not registed"), ReportStopComplete /
ReportRecoverStrategy / ReportRecoverStatus (400 UnRegistry "jobId=%s not registed"; 0 "jobId=%s,
uuid=%s, receive <RPC>"), ReportProcessFault (0 "receive ReportProcessFault"), HealthCheck (0
"jobId=%s, receive HeathCheck"); om_service.go ReplySwitchNicResult / ReplyStressTestResult (0 "reply
success", 400 "jobId=%s not registed"). Codes: pkg/domain/common/code.go (clusterd.md §1.1).

The NIC-switch and stress-test RPCs' codes: test_om_service.py; their flows:
tests/brain/test_om_flows.py.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from brain.brainkit import JOB, apply, npu_fault, wait_decision, wait_idle

from clusterd.brain import recover as recover_mod
from faultmesh._pb import recover_pb2 as pb
from faultmesh._pb import recover_pb2_grpc


@pytest.fixture
def stub(channel):
    return recover_pb2_grpc.RecoverStub(channel)


def ci(job=JOB):
    return pb.ClientInfo(jobId=job, role="taskd")


def status(r) -> tuple[int, str]:
    return r.code, r.info


async def registered(cd, stub, **over):
    await apply(cd, **over)
    assert (await stub.Init(ci())).code == 0
    assert (await stub.Register(ci())).code == 0


async def test_init_codes(cd, stub):
    # an unknown job: its PodGroup cannot be resolved -> 502
    assert status(await stub.Init(ci())) == (502, f"job(uid={JOB}) one of jobName, pgName, ns is empty")
    await apply(cd, **{"process-recover-enable": "", "subHealthyStrategy": "ignore"})
    assert status(await stub.Init(ci())) == (
        403,
        f"job(uid={JOB}) process-recover-enable and subhealthy hotswtich not open:<nil>",
    )
    await apply(cd, **{"process-recover-enable": "", "subHealthyStrategy": "hotSwitch"})
    assert status(await stub.Init(ci())) == (0, f"job(uid={JOB}) init success")  # hotSwitch alone is enough
    assert status(await stub.Init(ci())) == (0, f"job(uid={JOB}) init success")  # again: the same answer


async def test_register_codes(cd, stub, monkeypatch):
    await apply(cd, **{"process-recover-enable": "", "subHealthyStrategy": "hotSwitch"})
    assert status(await stub.Register(ci())) == (408, f"jobId={JOB} not inited")
    await stub.Init(ci())
    assert status(await stub.Register(ci())) == (0, "register success")
    assert cd.jobs.get(JOB).process_recover_enable == "on"  # the label is set on Register
    assert status(await stub.Register(ci())) == (0, "register success")  # a duplicate registration
    await apply(cd, id="job-0002-uid", name="other")
    await stub.Init(ci("job-0002-uid"))
    await cd.jobs.delete("job-0002-uid")  # gone between Init and Register
    assert status(await stub.Register(ci("job-0002-uid"))) == (
        402,
        "jobId=job-0002-uid not exist, reuse registry",
    )
    monkeypatch.setattr(recover_mod, "MAX_SERVED_JOBS", 1)
    await apply(cd, id="job-0003-uid", name="third")
    await stub.Init(ci("job-0003-uid"))
    assert status(await stub.Register(ci("job-0003-uid"))) == (
        500,
        "out of max serve jobs, reuse registry for jobId=job-0003-uid",
    )


async def test_subscribe_unregistered_is_a_grpc_error(cd, stub):
    call = stub.SubscribeProcessManageSignal(ci())
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call.read()
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.UNKNOWN, f"jobId={JOB} not registed")
    for sub in (stub.SubscribeNotifySwitch, stub.SubscribeNotifyExecStressTest):
        with pytest.raises(grpc.aio.AioRpcError):
            await sub(ci()).read()


def reports():
    return [
        (pb.StopCompleteRequest(jobId=JOB), "ReportStopComplete"),
        (pb.RecoverStrategyRequest(jobId=JOB, strategies=["recover"]), "ReportRecoverStrategy"),
        (pb.RecoverStatusRequest(jobId=JOB), "ReportRecoverStatus"),
    ]


async def test_reports_400_unregistered_0_registered(cd, stub):
    for req, rpc in reports():
        assert status(await getattr(stub, rpc)(req)) == (400, f"jobId={JOB} not registed")
    assert status(await stub.ReportProcessFault(pb.ProcessFaultRequest(jobId=JOB))) == (
        400,
        f"jobId={JOB} not registed",
    )
    for rpc, req in (
        (stub.ReplySwitchNicResult, pb.SwitchResult(jobId=JOB, result=True)),
        (stub.ReplyStressTestResult, pb.StressTestResult(jobId=JOB)),
    ):
        assert (await rpc(req)).code == 400
    await registered(cd, stub)
    uuid = cd.brain.controllers[JOB].uuid
    for req, rpc in reports():  # not awaited by any flow: dropped as "order mix", still 0
        assert status(await getattr(stub, rpc)(req)) == (0, f"jobId={JOB}, uuid={uuid}, receive {rpc}")
    assert cd.brain.controllers[JOB].state == "INIT"
    assert status(await stub.ReportProcessFault(pb.ProcessFaultRequest(jobId=JOB))) == (
        0,
        "receive ReportProcessFault",
    )
    # om_service.go ReplySwitchNicResult / ReplyStressTestResult: 0 "reply success"; an empty stress
    # result from a registered job is answered 0 (not 413, issue 14 item 8); no job id -> 400
    assert status(await stub.ReplySwitchNicResult(pb.SwitchResult(jobId=JOB, result=True))) == (
        0,
        "reply success",
    )
    assert status(await stub.ReplyStressTestResult(pb.StressTestResult(jobId=JOB))) == (0, "reply success")
    assert (await stub.ReplyStressTestResult(pb.StressTestResult(jobId=""))).code == 400


async def test_a_stale_report_after_the_flow_ended_changes_nothing(cd, stub, sims):
    await apply(cd)
    sim = await sims.start()
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "recover-success")
    await wait_idle(cd)
    ctl = cd.brain.controllers[JOB]
    n = len(cd.brain.decisions[JOB])
    # the finished flow's reports again: the reset cleared the uuid; answered 0, nothing moves
    for req, rpc in reports():
        assert status(await getattr(stub, rpc)(req)) == (0, f"jobId={JOB}, uuid=, receive {rpc}")
    assert ctl.state == "INIT" and not ctl.busy() and len(cd.brain.decisions[JOB]) == n
    assert sim.errors == []


async def test_keep_alive_carries_the_controllers_uuid(cd, stub):
    # controller.go selectKeepAlive: {Uuid: ctl.uuid, JobId, SignalType: "keep-alive"} every
    # keepAliveSecond (0.3 s in these tests)
    await registered(cd, stub)
    call = stub.SubscribeProcessManageSignal(ci())
    first = await asyncio.wait_for(call.read(), 2)
    assert (first.signalType, first.jobId, first.uuid) == ("keep-alive", JOB, "")
    uuid = "18C0FFEE-" + "a" * 32
    cd.brain.controllers[JOB].uuid = uuid  # a flow's uuid
    seen = [await asyncio.wait_for(call.read(), 2) for _ in range(3)]  # one may predate the change
    assert {s.signalType for s in seen} == {"keep-alive"} and seen[-1].uuid == uuid
    call.cancel()


async def test_health_check(stub):
    # no registration needed, any job id
    assert status(await stub.HealthCheck(ci())) == (0, f"jobId={JOB}, receive HeathCheck")
    assert status(await stub.HealthCheck(ci("x"))) == (0, "jobId=x, receive HeathCheck")
