"""Pipelined agent streams (issue 18): ClusterD reads a stream's next messages while the previous
ones commit, so many deltas of one stream share a store commit; each is still acked in order and
only once it is stored (issue 19: never ack what is not stored)."""

from __future__ import annotations

import asyncio
import sqlite3

import grpc

from faultmesh._pb import agent_pb2, agent_pb2_grpc

N = 40


def _delta(seq: int) -> agent_pb2.AgentMessage:
    f = agent_pb2.Fault(
        source="bmc-oem", device_type="CPU", device_id=seq, code=f"{seq:08X}", level="SeparateFault"
    )
    return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, upserts=[f]))


class HeldWrites:
    """Wrap ``store.write_faults``: the first call waits for :attr:`release`; ``fail_first`` makes
    that call raise instead of writing. Records the device ids each committed call stored."""

    def __init__(self, store, fail_first: bool = False) -> None:
        self.release = asyncio.Event()
        self.committed: list[set[int]] = []
        self.calls = 0
        self._real, self._fail = store.write_faults, fail_first
        store.write_faults = self._write

    async def _write(self, upserts=(), removals=(), marks=None):
        upserts = list(upserts)
        self.calls += 1
        if self.calls == 1:
            await self.release.wait()
            if self._fail:
                raise sqlite3.OperationalError("database or disk is full")
        await self._real(upserts, removals, marks)
        self.committed.append({f.device_id for f, _ in upserts})

    def stored(self) -> set[int]:
        return set().union(*self.committed)


async def _open(cd):
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}")
    call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
    await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", agent="noded")))
    await call.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1)))
    ack = await asyncio.wait_for(call.read(), 10)
    assert ack.ack.seq == 1 and not ack.ack.error
    return ch, call


async def _read_until_quiet(call) -> list[agent_pb2.ControlMessage]:
    out = []
    while True:
        try:
            msg = await asyncio.wait_for(call.read(), 2.0)
        except TimeoutError:
            return out
        if msg is grpc.aio.EOF:
            return out
        out.append(msg)


async def _wait_read(cd, n: int) -> None:
    deltas = cd.agents.messages.labels("delta")
    for _ in range(200):
        if deltas._value.get() >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"clusterd read {deltas._value.get()} of {n} deltas")


async def test_deltas_sent_back_to_back_share_a_commit_and_are_acked_in_order_once_stored(cd):
    ch, call = await _open(cd)
    held = HeldWrites(cd.store)
    try:
        for seq in range(2, N + 2):
            await call.write(_delta(seq))
        await _wait_read(cd, N)  # every delta read while the first commit is held: nothing acked
        held.release.set()
        acks = []
        while len(acks) < N:
            msg = await asyncio.wait_for(call.read(), 10)
            assert msg.WhichOneof("body") == "ack" and not msg.ack.error, msg
            assert msg.ack.seq in held.stored(), f"seq {msg.ack.seq} acked before it was stored"
            acks.append(msg.ack.seq)
        assert acks == list(range(2, N + 2))
        assert held.calls == 2  # the first delta alone, the N - 1 read meanwhile in one commit
        assert sorted(f.device_id for f, _ in await cd.store.load_faults()) == list(range(2, N + 2))
    finally:
        call.cancel()
        await ch.close()


async def test_a_failed_commit_in_a_pipeline_acks_nothing_unstored_and_ends_the_stream(cd):
    ch, call = await _open(cd)
    held = HeldWrites(cd.store, fail_first=True)
    try:
        for seq in range(2, 12):
            await call.write(_delta(seq))
        await _wait_read(cd, 10)
        held.release.set()
        got = await _read_until_quiet(call)
        acks = [(m.ack.seq, m.ack.error) for m in got if m.WhichOneof("body") == "ack"]
        assert acks and acks[0][0] == 2 and acks[0][1].startswith("internal: state write failed")
        assert all(err for _, err in acks), f"a message acked after the failed one: {acks}"
        assert 2 not in held.stored()  # nothing of the failed batch is stored, nor kept in memory
        assert all(f.device_id != 2 for f in cd.center.faults())
        assert all(f.device_id != 2 for f, _ in await cd.store.load_faults())
    finally:
        call.cancel()
        await ch.close()
