"""Registrations of job.Job, fault.Fault and config.Config (issue 19 #8): they need the token when
one is configured, are bounded per caller (at the cap and cap + 1), expire when no stream holds them,
and a flood (100,000 job Registers, 20,000 fault registrations) neither locks out a legitimate
client nor grows memory past the per-caller cap."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from brain.brainkit import JOB, apply, npu_fault
from support import make_clusterd

from clusterd.brain import jobsvc, registrations
from faultmesh._pb import config_pb2, config_pb2_grpc, fault_pb2, fault_pb2_grpc, job_pb2, job_pb2_grpc

CAP = registrations.MAX_PER_CALLER
TTL = registrations.IDLE_TTL_S


class Peer:
    """The part of a gRPC context the Register RPCs read: who is calling."""

    def __init__(self, host: str) -> None:
        self._peer = f"ipv4:{host}:40000"

    def peer(self) -> str:
        return self._peer

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


async def until(pred, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()  # the registrations made so far carry monotonic deadlines

    def __call__(self) -> float:
        return self.now


def test_caller_is_the_peer_host():
    assert registrations.caller_of(Peer("10.0.0.1")) == "10.0.0.1"
    ctx = Peer("x")
    ctx._peer = "ipv6:[::1]:5000"
    assert registrations.caller_of(ctx) == "::1"


async def test_a_job_register_flood_is_capped_per_caller_and_locks_nobody_out(cd):
    svc = cd.brain.job_svc
    flood, req = Peer("10.9.9.9"), job_pb2.ClientInfo(role="FdAgent")
    codes = [(await svc.Register(req, flood)).code for _ in range(100_000)]
    assert codes[:CAP] == [200] * CAP and set(codes[CAP:]) == {429}  # the cap, then cap + 1
    assert len(svc.clients) == CAP  # memory holds at the cap
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        r = await job_pb2_grpc.JobStub(ch).Register(req)  # a legitimate client elsewhere
    assert r.code == 200


async def test_registrations_without_a_stream_expire_and_open_streams_hold_theirs(cd):
    svc = cd.brain.job_svc
    clock = svc.regs.clock = Clock()
    req = job_pb2.ClientInfo(role="FdAgent")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        stub = job_pb2_grpc.JobStub(ch)
        held = (await stub.Register(req)).clientId
        idle = (await stub.Register(req)).clientId
        call = stub.SubscribeJobSummarySignalList(job_pb2.ClientInfo(role="FdAgent", clientId=held))
        await until(lambda: held in svc.subs)
        clock.now += TTL - 0.5  # within the idle time: both kept
        assert svc.regs.prune() == 0 and idle in svc.clients
        clock.now += 0.5  # at it: the idle one expires, the subscribed one stays
        assert svc.regs.prune() == 1 and idle not in svc.clients and held in svc.clients
        call.cancel()
        await until(lambda: held not in svc.subs)
        clock.now += TTL  # its stream is gone: its idle time ran out
        assert svc.regs.prune() == 1 and held not in svc.clients
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.SubscribeJobSummarySignal(job_pb2.ClientInfo(role="FdAgent", clientId=held)).read()
        assert "not registered" in e.value.details()
    flood = Peer("10.9.9.9")
    for _ in range(CAP):
        await svc.Register(req, flood)
    assert (await svc.Register(req, flood)).code == 429
    clock.now += TTL
    assert (await svc.Register(req, flood)).code == 200  # the flood's old registrations expired
    assert len(svc.clients) == 1


async def test_a_fault_registration_flood_is_capped_per_caller(cd):
    svc = cd.brain.fault
    flood = Peer("10.9.9.9")
    codes = [
        (await svc.Register(fault_pb2.ClientInfo(jobId="", role=f"r{i}"), flood)).code for i in range(20_000)
    ]
    assert codes[:CAP] == [0] * CAP and set(codes[CAP:]) == {500}
    assert len(svc.pubs) == CAP
    assert (await svc.Register(fault_pb2.ClientInfo(jobId="", role="r0"), flood)).code == 0  # its own key
    await apply(cd)
    await cd.center.upsert(npu_fault(), origin="deviced")  # a later change costs one pass over <= CAP
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        stub = fault_pb2_grpc.FaultStub(ch)
        assert (await stub.Register(fault_pb2.ClientInfo(jobId="", role="platform"))).code == 0
        call = stub.SubscribeFaultMsgSignal(fault_pb2.ClientInfo(jobId="", role="platform"))
        sig = await asyncio.wait_for(call.read(), 5)
        assert sig.jobId == JOB and sig.signalType == "fault"
        call.cancel()
        await until(lambda: ("-1", "platform") not in svc.pubs)  # its stream ended: removed
    svc.regs.clock = clock = Clock()
    clock.now += TTL * 2
    svc.regs.prune()
    assert len(svc.pubs) == 0  # nobody subscribed to the flood's publishers: all expired


async def test_config_registrations_for_jobs_that_do_not_exist_are_capped(cd, monkeypatch):
    monkeypatch.setattr(jobsvc, "MAX_UNKNOWN_JOB_REGS", 3)
    svc = cd.brain.config_svc
    for i in range(3):  # at the cap, each from another caller
        r = await svc.Register(config_pb2.ClientInfo(jobId=f"nojob-{i}", role="r"), Peer(f"10.0.0.{i}"))
        assert r.code == 0
    r = await svc.Register(config_pb2.ClientInfo(jobId="nojob-3", role="r"), Peer("10.0.0.9"))
    assert r.code == 429 and "do not exist" in r.info  # cap + 1
    r = await svc.Register(config_pb2.ClientInfo(jobId="nojob-0", role="r"), Peer("10.0.0.0"))
    assert r.code == 0  # re-registering one already counted
    await apply(cd)
    r = await svc.Register(config_pb2.ClientInfo(jobId=JOB, role="r"), Peer("10.0.0.9"))
    assert r.code == 0  # a job that exists is not capped by them
    monkeypatch.setattr(registrations, "MAX_PER_CALLER", 2)
    svc.regs.max_per_caller = 2
    flood = Peer("10.9.9.9")
    # publishers are keyed by jobId (the reference's): three job ids from one caller
    r1 = await svc.Register(config_pb2.ClientInfo(jobId=JOB, role="a"), flood)
    r2 = await svc.Register(config_pb2.ClientInfo(jobId="nojob-1", role="a"), flood)
    r3 = await svc.Register(config_pb2.ClientInfo(jobId="nojob-2", role="a"), flood)
    assert (r1.code, r2.code, r3.code) == (0, 0, 429)


async def test_with_a_token_registrations_need_it_and_cannot_end_an_authenticated_stream(tmp_path):
    (tmp_path / "token").write_text("t0ken\n")
    cd = await make_clusterd(tmp_path, "--token-file", str(tmp_path / "token"))
    good = (("authorization", "Bearer t0ken"),)
    try:
        await apply(cd)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            fstub, jstub = fault_pb2_grpc.FaultStub(ch), job_pb2_grpc.JobStub(ch)
            cstub = config_pb2_grpc.ConfigStub(ch)
            ci = fault_pb2.ClientInfo(jobId=JOB, role="platform")
            assert (await fstub.Register(ci, metadata=good)).code == 0
            call = fstub.SubscribeFaultMsgSignal(ci, metadata=good)
            await until(lambda: cd.brain.fault.regs._open)
            for rpc in (
                lambda: fstub.Register(ci),
                lambda: jstub.Register(job_pb2.ClientInfo(role="FdAgent")),
                lambda: cstub.Register(config_pb2.ClientInfo(jobId=JOB, role="r")),
                lambda: fstub.SubscribeFaultMsgSignal(ci).read(),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await rpc()
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            await cd.center.upsert(npu_fault(), origin="deviced")
            sig = await asyncio.wait_for(call.read(), 5)  # the authenticated stream lives on
            assert sig.jobId == JOB and sig.signalType == "fault"
            call.cancel()
            assert (await jstub.Register(job_pb2.ClientInfo(role="FdAgent"), metadata=good)).code == 200
            assert len(cd.brain.job_svc.clients) == 1
    finally:
        await cd.stop()
