"""Recover RPCs: ReportProcessFault, the token (clusterd.md §2.1); the control RPCs' and the O&M RPCs'
codes are in tests/conformance/test_recover_service.py and test_om_service.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from brain.brainkit import JOB, apply, decisions, npu_fault, wait_decision

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


# SwitchNicTrack / StressTest / the O&M streams: codes and texts in tests/conformance/test_om_service.py


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


async def test_a_job_deleted_and_applied_again_is_decided_again(cd):
    # The intake remembers which faults of an unregistered job it has acted on; a deleted job's memory
    # must go with it (it leaked, and a job re-created under the same id never got its decision).
    await apply(cd)
    await cd.center.upsert(npu_fault())
    await wait_decision(cd, "job-rescheduling")
    await cd.jobs.delete(JOB)
    await apply(cd)
    async with asyncio.timeout(10):
        while decisions(cd).count("job-rescheduling") < 2:
            await asyncio.sleep(0.02)


async def _slot_filled(cd, stub):
    """Registered, a flow expecting a stop report that it has not taken yet, the slot full."""
    await registered(cd, stub)
    ctl = cd.brain.controllers[JOB]
    ctl.uuid = "U1"
    ctl.expect("stop")
    first = pb.StopCompleteRequest(jobId=JOB, status=pb.Status(code=0, info="first"))
    assert (await stub.ReportStopComplete(first)).code == 0  # into the 1-slot channel
    return ctl


async def test_a_report_on_a_busy_slot_waits_for_the_flow(cd, stub):
    # fault_recover_service.go ReportStopComplete: `controller.reportStopCompleteChan <- request`, a
    # blocking send on a 1-slot channel. TaskD's Go manager ignores the answer's code
    # (manager.go reportStopComplete), so answering 504 instead of waiting lost the report.
    ctl = await _slot_filled(cd, stub)
    second = asyncio.ensure_future(
        stub.ReportStopComplete(pb.StopCompleteRequest(jobId=JOB, status=pb.Status(code=0, info="second")))
    )
    await asyncio.sleep(1.3)  # longer than the old 1 s bound
    assert not second.done()
    _, rep = await ctl.wait("stop")
    assert rep.status.info == "first"
    r = await asyncio.wait_for(second, 2)
    assert (r.code, r.info) == (0, f"jobId={JOB}, uuid=U1, receive ReportStopComplete")
    assert ctl._slot("stop").get_nowait().status.info == "second"  # delivered, not dropped


async def test_a_waiting_report_gets_599_when_the_controller_resets(cd, stub):
    # the reference's reset closes the channels: the blocked send panics, catchAndSetExceptionInfo
    # answers 599 ServerInnerError "jobId=%s, uuid=%s, chan closed" (the uuid after the reset: "")
    ctl = await _slot_filled(cd, stub)
    second = asyncio.ensure_future(stub.ReportStopComplete(pb.StopCompleteRequest(jobId=JOB)))
    await asyncio.sleep(0.2)
    await ctl.reset("test")
    r = await asyncio.wait_for(second, 2)
    assert (r.code, r.info) == (599, f"jobId={JOB}, uuid=, chan closed")


async def test_a_report_still_waiting_after_the_report_timeout_gets_504(cd, stub):
    # faultmesh's own bound (every wait has one): --report-timeout-s (2 s in these tests)
    await _slot_filled(cd, stub)
    t0 = asyncio.get_running_loop().time()
    r = await stub.ReportStopComplete(pb.StopCompleteRequest(jobId=JOB))
    assert (r.code, r.info) == (504, "report queue busy")
    assert asyncio.get_running_loop().time() - t0 >= 1.9


async def test_two_reports_waited_for_together_are_both_kept(cd, stub):
    # a flow waiting on two kinds at once (stress result or a 406 status; NIC result or status): the
    # reference selects one channel and the other report stays in its slot. Both already queued
    # used to complete both getters, and the one not returned was lost (a stress result lost: the
    # test then timed out).
    await registered(cd, stub)
    ctl = cd.brain.controllers[JOB]
    ctl.expect("stress", "status")
    st = pb.RecoverStatusRequest(jobId=JOB, status=pb.Status(code=406))
    assert (await stub.ReportRecoverStatus(st)).code == 0
    assert (await stub.ReplyStressTestResult(pb.StressTestResult(jobId=JOB))).code == 0
    first = await ctl.wait("stress", "status", timeout_s=1, keep=True)
    second = await ctl.wait("stress", "status", timeout_s=1)
    assert first is not None and second is not None
    assert {first[0], second[0]} == {"stress", "status"}
