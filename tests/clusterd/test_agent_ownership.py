"""Ownership on the agent stream (issue 19 #3): a stream changes only its own agent's faults, and a
second stream for the same (node, agent) takes over cleanly (logged, counted), never silently."""

from __future__ import annotations

import asyncio
import logging

import grpc
from support import public_request

from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.wire import key_to_pb


def _pb(
    code: str, source: str = "bmc-oem", dev: int = 0, level: str = "SeparateFault", **kw
) -> agent_pb2.Fault:
    return agent_pb2.Fault(source=source, device_type="NPU", device_id=dev, code=code, level=level, **kw)


def _hello(boot: str, node: str = "node-1", agent: str = "noded") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent=agent, boot_id=boot))


async def _ack(call, seq: int) -> agent_pb2.Ack:
    while True:
        msg = await asyncio.wait_for(call.read(), 5)
        assert msg is not grpc.aio.EOF, "stream ended before the ack"
        if msg.WhichOneof("body") == "ack" and msg.ack.seq == seq:
            return msg.ack


async def test_an_agent_cannot_remove_or_overwrite_public_or_other_agents_faults(cd):
    assert (await cd.pubfault.intake(public_request("fault-own-0001", node="node-1"))).code == 0
    public = next(f for f in cd.center.faults("node-1"))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        dev = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await dev.write(_hello("d1", agent="deviced"))
        await dev.write(
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[_pb("80E01801", "dcmi")]))
        )
        assert (await _ack(dev, 1)).error == ""
        deviced = next(f for f in cd.center.faults("node-1") if f.source == "dcmi")

        nod = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await nod.write(_hello("n1"))
        hijack = _pb(public.code, public.source, level="NotHandleFault")
        await nod.write(
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[hijack, _pb("00000001")]))
        )
        assert (await _ack(nod, 1)).error.startswith("foreign_origin")
        delta = agent_pb2.Delta(
            seq=2, removals=[key_to_pb(public.key), key_to_pb(deviced.key)], upserts=[_pb("00000002", dev=1)]
        )
        await nod.write(agent_pb2.AgentMessage(delta=delta))
        ack = await _ack(nod, 2)
        assert ack.error == "foreign_origin: 2 faults of another origin not changed"
        nod.cancel()
        dev.cancel()
    assert cd.center.get(public.key) == public and cd.center.origin(public.key) == "public"
    assert cd.center.get(deviced.key) is not None and cd.center.origin(deviced.key) == "deviced"
    assert sorted(f.code for f in cd.center.faults_of_origin("noded")) == ["00000001", "00000002"]
    assert cd.rejected.labels("agent", "foreign_origin")._value.get() == 2


async def test_a_second_stream_takes_over_and_the_old_one_applies_nothing_more(cd, caplog):
    caplog.set_level(logging.INFO, logger="clusterd.agents")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        old = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await old.write(_hello("boot-a"))
        await old.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[_pb("0000000A")])))
        await _ack(old, 1)
        # a restarted agent (new boot id) connects while the old stream is still open
        new = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await new.write(_hello("boot-b"))
        await new.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[_pb("0000000B")])))
        await _ack(new, 1)
        assert await asyncio.wait_for(old.read(), 5) is grpc.aio.EOF  # the old stream was closed
        late = agent_pb2.Delta(seq=2, upserts=[_pb("0000000C", dev=2)])
        try:
            await old.write(agent_pb2.AgentMessage(delta=late))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass
        await asyncio.sleep(0.2)
        assert [f.code for f in cd.center.faults("node-1")] == ["0000000B"]
        # the same boot id again: a clean reconnect
        again = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await again.write(_hello("boot-b"))
        await again.write(
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[_pb("0000000B")]))
        )
        await _ack(again, 1)
        for c in (old, new, again):
            c.cancel()
    taken = [r for r in caplog.records if "agent stream taken over" in r.getMessage()]
    assert ["reason=restart" in taken[0].getMessage(), "reason=reconnect" in taken[1].getMessage()] == [
        True,
        True,
    ]
    assert taken[0].levelno == logging.WARNING and taken[1].levelno == logging.INFO
    assert cd.agents.takeovers.labels("restart")._value.get() == 1
    assert cd.agents.takeovers.labels("reconnect")._value.get() == 1
