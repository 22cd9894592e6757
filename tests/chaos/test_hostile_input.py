"""Hostile agent streams and registration floods (issue 19): every cap holds, nothing a legitimate
agent or client owns is lost, and the junk is counted instead of logged per call.

The stream storm runs in-process (seconds); the flood against a real ``clusterd`` process with a token
(its memory measured from outside) is behind the ``slow`` marker.
"""

from __future__ import annotations

import asyncio
import logging
import random
import urllib.request

import grpc
import pytest
from support import ClusterdProcess, make_clusterd

from clusterd.brain import registrations
from clusterd.ingest import agents as agents_mod
from faultmesh._pb import (
    agent_pb2,
    config_pb2,
    config_pb2_grpc,
    fault_pb2,
    fault_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
)
from faultmesh.agent import AgentClient
from faultmesh.model import Fault

NODE = "node-good"


def _f(i: int, node: str = "", source: str = "bmc-oem") -> agent_pb2.Fault:
    return agent_pb2.Fault(
        source=source, node=node, device_type="CPU", device_id=i, code=f"{i:08X}", level="SeparateFault"
    )


def _m(**body) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(**body)


def _hello(agent="evil", node=NODE, sn="") -> agent_pb2.AgentMessage:
    return _m(hello=agent_pb2.Hello(node=node, agent=agent, node_sn=sn))


def hostile_streams() -> list[tuple[str, list]]:
    """(what, messages) of each hostile stream; ``b"..."`` items are raw undecodable bytes."""
    own = agent_pb2.FaultKey(source="bmc-oem", device_type="CPU", device_id=1, code="00000001")
    return [
        ("junk bytes", [b"\xff\xff\xff\xff"]),
        ("no hello", [_m(snapshot=agent_pb2.Snapshot(seq=1))]),
        ("agent name with a newline", [_hello("noded\n")]),
        ("serial number too long", [_hello(sn="S" * 129)]),
        ("remove another agent's fault", [_hello(), _m(delta=agent_pb2.Delta(seq=1, removals=[own]))]),
        (
            "upsert a public fault",
            [_hello(), _m(delta=agent_pb2.Delta(seq=1, upserts=[_f(1, source="public:x")]))],
        ),
        (
            "too many faults",
            [_hello(), _m(snapshot=agent_pb2.Snapshot(seq=1, faults=[_f(i) for i in range(51)]))],
        ),
        (
            "fault of another node",
            [_hello(), _m(delta=agent_pb2.Delta(seq=1, upserts=[_f(2, node="node-x")]))],
        ),
        (
            "65 conditions",
            [
                _hello(),
                _m(
                    delta=agent_pb2.Delta(
                        seq=1, conditions=[agent_pb2.Condition(type=f"c{i}", active=True) for i in range(65)]
                    )
                ),
            ],
        ),
        (
            "replayed delta",
            [
                _hello(),
                _m(snapshot=agent_pb2.Snapshot(seq=1)),
                _m(delta=agent_pb2.Delta(seq=2, upserts=[_f(3)])),
                _m(delta=agent_pb2.Delta(seq=2, upserts=[_f(3)])),
            ],
        ),
        (
            "delta after a gap",
            [
                _hello(),
                _m(snapshot=agent_pb2.Snapshot(seq=1)),
                _m(delta=agent_pb2.Delta(seq=9, upserts=[_f(4)])),
            ],
        ),
    ]


async def run_hostile(port: int, messages: list, name: str) -> None:
    """One hostile stream; its Hello claims agent ``name`` (each stream its own: no takeovers)."""
    messages = [
        _hello(name, m.hello.node, m.hello.node_sn)
        if not isinstance(m, bytes) and m.WhichOneof("body") == "hello" and m.hello.agent == "evil"
        else m
        for m in messages
    ]
    ident = {"request_serializer": None, "response_deserializer": None}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/faultmesh.v1.AgentStream/Connect", **ident)(timeout=5)
        try:
            for m in messages:
                await call.write(m if isinstance(m, bytes) else m.SerializeToString())
            while True:
                got = await asyncio.wait_for(call.read(), 1.0)
                if got is grpc.aio.EOF:
                    return
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError):
            return
        finally:
            call.cancel()


def legit_fault(i: int) -> Fault:
    return Fault(
        source="bmc-oem", node=NODE, device_type="CPU", device_id=i, code=f"{i:08X}", level="SeparateFault"
    )


async def test_hostile_agent_streams_leave_a_legitimate_agent_untouched(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(agents_mod, "MAX_FAULTS_PER_MESSAGE", 50)
    caplog.set_level(logging.INFO)
    cd = await make_clusterd(tmp_path)
    good = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", backoff_max_s=0.5)
    for i in range(1, 6):
        good.state.upsert(legit_fault(i))
    await good.start()
    rnd = random.Random(19)
    try:
        await good.wait_synced()
        for _ in range(4):
            storm = hostile_streams() * 3
            rnd.shuffle(storm)
            churn = rnd.randrange(6, 12)
            good.state.upsert(legit_fault(churn))  # the legitimate agent keeps changing meanwhile
            good.state.remove(legit_fault(rnd.randrange(1, 6)).key)
            await asyncio.gather(
                *(run_hostile(cd.grpc_port, msgs, f"evil{i}") for i, (_, msgs) in enumerate(storm))
            )
        await good.wait_synced()
        ours = {f.key for f in good.state.faults.values()}
        assert {f.key for f in cd.center.faults(NODE) if cd.center.origin(f.key) == "noded"} == ours
        assert {f.key for f in cd.center.faults(NODE)} <= ours  # nothing of the storm was stored
        assert cd.center.faults("node-x") == []
        assert len(cd.nodes.get(NODE).conditions) <= 64
        counted = {
            s.labels["reason"]: s.value
            for m in cd.registry.collect()
            if m.name == "faultmesh_rejected_requests"
            for s in m.samples
            if s.name.endswith("_total")
        }
        for reason in (
            "undecodable", "no_hello", "bad_hello", "foreign_origin", "too_many_faults",
            "foreign_node", "bad_state", "seq_replay", "seq_gap",
        ):  # fmt: skip
            assert counted.get(reason, 0) >= 4, reason
        assert not [r for r in caplog.records if r.exc_info], "a traceback reached the log"
    finally:
        await good.stop()
        await cd.stop()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_registration_floods_lock_nobody_out_and_memory_stays_bounded(tmp_path):
    (tmp_path / "token").write_text("t0ken\n")
    cd = ClusterdProcess(
        tmp_path / "state",
        ["--token-file", str(tmp_path / "token"), "--unary-qps", "1000000"],  # the token check is tested
    )
    await asyncio.to_thread(cd.start)
    good = (("authorization", "Bearer t0ken"),)
    try:
        async with grpc.aio.insecure_channel(cd.grpc) as ch:
            jstub, fstub = job_pb2_grpc.JobStub(ch), fault_pb2_grpc.FaultStub(ch)
            cstub = config_pb2_grpc.ConfigStub(ch)
            before = rss_kib(cd.proc.pid)

            async def refused(coro) -> bool:
                try:
                    await coro
                except grpc.aio.AioRpcError as e:
                    return e.code() == grpc.StatusCode.UNAUTHENTICATED
                return False

            # 200 x 50 token-less job Registers (50: under the 64 streams of one connection), then fault
            # and config ones
            for _ in range(200):
                results = await asyncio.gather(
                    *(refused(jstub.Register(job_pb2.ClientInfo(role="FdAgent"))) for _ in range(50))
                )
                assert all(results)
            for i in range(0, 4000, 50):
                assert all(
                    await asyncio.gather(
                        *(
                            refused(fstub.Register(fault_pb2.ClientInfo(jobId="", role=f"r{j}")))
                            for j in range(i, i + 50)
                        )
                    )
                )
                assert all(
                    await asyncio.gather(
                        *(
                            refused(cstub.Register(config_pb2.ClientInfo(jobId=f"j{j}", role="r")))
                            for j in range(i, i + 50)
                        )
                    )
                )
            # a token holder that floods is capped per caller
            codes = [(await fstub.Register(fault_pb2.ClientInfo(jobId="", role=f"t{j}"), metadata=good)).code
                     for j in range(registrations.MAX_PER_CALLER + 50)]  # fmt: skip
            assert codes.count(0) == registrations.MAX_PER_CALLER and set(codes) == {0, 500}
            r = await jstub.Register(job_pb2.ClientInfo(role="FdAgent"), metadata=good)
            assert r.code == 200  # another service of the same caller is not locked out
            grown_mib = (rss_kib(cd.proc.pid) - before) / 1024
        assert grown_mib < 64, f"clusterd grew {grown_mib:.0f} MiB under the floods"
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(cd.url("/metrics"), timeout=5).read().decode()
        )
        assert 'faultmesh_rejected_requests_total{reason="unauthenticated",service="brain"} 18000.0' in text
        assert "Traceback" not in cd.log_text()
    finally:
        await asyncio.to_thread(cd.stop)
