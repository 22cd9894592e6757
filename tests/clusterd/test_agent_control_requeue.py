"""Control messages of an agent stream that died before the agent acked them are queued again, in
order and once each, on the agent's next stream (clusterd.ingest.control); what is kept is bounded."""

from __future__ import annotations

import asyncio
import logging

import grpc
from support import eventually

from clusterd.ingest.control import LeftControl
from clusterd.ingest.session import MAX_KEPT, ControlLog
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient


def switch(i: int) -> dict:
    return {"data_trace": agent_pb2.DataTraceSwitch(job_ns_name=f"ns/job-{i}", step="on")}


async def open_silent(port: int, ch: grpc.aio.Channel, node: str = "node-1") -> grpc.aio.StreamStreamCall:
    """A noded stream that says Hello and a snapshot, reads the snapshot's ack and then never acks
    anything: to ClusterD a live stream that died unnoticed."""
    call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
    await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent="noded", boot_id="b1")))
    await call.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1)))
    msg = await asyncio.wait_for(call.read(), 10)
    assert msg.ack.seq == 1 and not msg.ack.error
    return call


async def read_controls(call, n: int) -> list[str]:
    out = []
    while len(out) < n:
        msg = await asyncio.wait_for(call.read(), 10)
        if msg.WhichOneof("body") == "data_trace":
            out.append(msg.data_trace.job_ns_name)
    return out


def acked(cd) -> int:
    """The highest control seq node-1's noded acked on its live stream (-1: none live)."""
    s = cd.agents.sessions.get(("node-1", "noded"))
    return s.acked_control if s is not None else -1


def collecting_client(cd, got: list[str]) -> AgentClient:
    async def on_control(msg):
        got.append(msg.data_trace.job_ns_name)

    return AgentClient(
        f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", on_control=on_control, backoff_max_s=0.5
    )


async def test_messages_of_a_stream_that_died_unnoticed_arrive_once_in_order_on_the_next(cd, caplog):
    caplog.set_level(logging.INFO, "clusterd.agents")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        old = await open_silent(cd.grpc_port, ch)
        for i in range(3):
            assert await cd.agents.send("node-1", "noded", **switch(i))
        # the old stream got them (its agent applied them, say) but its acks never came back
        assert await read_controls(old, 3) == ["ns/job-0", "ns/job-1", "ns/job-2"]
        got: list[str] = []
        client = collecting_client(cd, got)
        await client.start()  # the agent's next stream takes the silent one over
        try:
            await eventually(lambda: len(got) >= 3, what="the re-queued messages")
            assert await cd.agents.send("node-1", "noded", **switch(3))
            await eventually(lambda: len(got) >= 4, what="the new message")
            session = cd.agents.sessions[("node-1", "noded")]
            await eventually(lambda: session.acked_control == 4, what="all acked")
            assert len(session.control) == 0  # acked: nothing kept
            assert got == ["ns/job-0", "ns/job-1", "ns/job-2", "ns/job-3"]
            # the old stream was ended at the takeover: not the new message, not the old ones again
            assert await asyncio.wait_for(old.read(), 10) is grpc.aio.EOF
        finally:
            await client.stop()
    lines = [r.getMessage() for r in caplog.records if "control messages re-queued" in r.getMessage()]
    assert len(lines) == 1 and "node=node-1" in lines[0] and "count=3" in lines[0], lines
    assert cd.agents.control.requeued._value.get() == 3


async def test_messages_of_a_stream_that_ended_wait_for_the_agents_next_stream(cd):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        old = await open_silent(cd.grpc_port, ch)
        for i in range(2):
            assert await cd.agents.send("node-1", "noded", **switch(i))
        await read_controls(old, 2)
        old.cancel()  # this end ClusterD sees
    await eventually(lambda: cd.agents.connected() == [], what="the stream's end")
    got: list[str] = []
    client = collecting_client(cd, got)
    await client.start()
    try:
        await eventually(lambda: len(got) >= 2, what="the left messages")
        await eventually(lambda: acked(cd) == 2, what="both acked")
        assert got == ["ns/job-0", "ns/job-1"]
        assert len(cd.agents.control.left) == 0
    finally:
        await client.stop()


async def test_an_unacked_backlog_past_the_bound_keeps_the_newest_and_counts_the_rest(cd):
    extra = 7
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        await open_silent(cd.grpc_port, ch)
        for i in range(MAX_KEPT + extra):
            assert await cd.agents.send("node-1", "noded", **switch(i))
        got: list[str] = []
        client = collecting_client(cd, got)
        await client.start()
        try:
            await eventually(lambda: len(got) >= MAX_KEPT, 60, "the kept messages")
            await eventually(lambda: acked(cd) == MAX_KEPT, 60, "all acked")
            assert got == [f"ns/job-{i}" for i in range(extra, MAX_KEPT + extra)]
        finally:
            await client.stop()
    dropped = cd.agents.control.dropped.labels("kept_full")._value.get()
    assert dropped == extra


def test_control_log_bounds_count_and_bytes_and_forgets_what_is_acked():
    log = ControlLog(max_count=3, max_bytes=10_000)
    for seq in range(1, 6):
        log.keep(agent_pb2.ControlMessage(seq=seq, **switch(seq)))
    assert [m.seq for m in log.unacked()] == [3, 4, 5]
    log.ack(4)
    assert [m.seq for m in log.unacked()] == [5]
    big = agent_pb2.ControlMessage(seq=6, data_trace=agent_pb2.DataTraceSwitch(job_ns_name="n/" + "j" * 6000))
    assert log.keep(big) == 0  # 6 kB + the small one fit in 10 kB
    assert log.keep(agent_pb2.ControlMessage(seq=7, data_trace=big.data_trace)) == 2  # 12 kB do not
    assert [m.seq for m in log.unacked()] == [7] and log.bytes == big.ByteSize()


def test_left_control_bounds_bytes_and_age():
    def log_of(*seqs: int) -> ControlLog:
        lg = ControlLog()
        for s in seqs:
            lg.keep(
                agent_pb2.ControlMessage(
                    seq=s, data_trace=agent_pb2.DataTraceSwitch(job_ns_name="n/" + "j" * 98)
                )
            )
        return lg

    size = log_of(1).bytes
    left = LeftControl(max_bytes=3 * size)
    left.put(("a", "noded"), log_of(1, 2))
    left.put(("b", "noded"), log_of(1, 2))  # 4 messages > 3: a's go
    assert left.take(("a", "noded")) == [] and [m.seq for m in left.take(("b", "noded"))] == [1, 2]
    assert left.take(("b", "noded")) == []  # taken once
    old = LeftControl(max_age_s=0.0)
    old.put(("a", "noded"), log_of(1))
    assert old.take(("a", "noded")) == [] and len(old) == 0
