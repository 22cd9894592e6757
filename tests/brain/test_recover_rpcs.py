"""Recover RPCs: ReportProcessFault, the token (clusterd.md §2.1); the control RPCs' and the O&M RPCs'
codes are in tests/conformance/test_recover_service.py and test_om_service.py."""

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


async def test_report_504_when_the_slot_stays_busy(cd, stub):
    await registered(cd, stub)
    ctl = cd.brain.controllers[JOB]
    ctl.expect("stop")  # a flow waits for a stop report but does not take it
    req = pb.StopCompleteRequest(jobId=JOB)
    assert (await stub.ReportStopComplete(req)).code == 0  # fills the 1-slot channel
    r = await stub.ReportStopComplete(req)
    assert (r.code, r.info) == (504, "report queue busy")
