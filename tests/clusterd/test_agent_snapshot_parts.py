"""A node state larger than one gRPC message reaches ClusterD (agent.proto's "Snapshot parts").

A Snapshot over ClusterD's 4 MiB receive limit (a node near the 65,536-fault cap with large
attributes) goes as several parts of about 1 MiB when ClusterD's response headers say it collects
them; ClusterD applies nothing before the last part, then the whole as one snapshot, and acks its
seq. Seen from the user's side: the faults clusterd holds, its metrics and the agent's reason."""

from __future__ import annotations

import asyncio

import grpc
from support import eventually

from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient, AgentState
from faultmesh.agentstate import snapshot_parts
from faultmesh.model import Fault
from faultmesh.wire import SNAPSHOT_MAX_BYTES_HEADER

NODE = "node-1"
ATTRS = {f"k{i}": "v" * 60 for i in range(4)}  # ~330 bytes a fault: 40,000 faults take ~13 MB


def fault(i: int, attrs: dict[str, str] = ATTRS, source: str = "bmc-oem") -> Fault:
    return Fault(source=source, node=NODE, device_type="CPU", device_id=i % 64, code=f"{i:08X}",
                 level="SeparateFault", first_seen_ms=1_700_000_000_000 + i, attributes=attrs)  # fmt: skip


def big_state(n: int = 40_000, source: str = "bmc-oem") -> AgentState:
    st = AgentState(NODE)
    for i in range(n):
        st.upsert(fault(i, source=source))
    st.set_node_status("UnHealthy")
    st.set_condition("BMCUnreachable", False)
    return st


def sample(cd, name: str, **labels: str) -> float:
    return cd.registry.get_sample_value(name, labels) or 0.0


def rejected(cd, reason: str) -> float:
    return sample(cd, "faultmesh_rejected_requests_total", service="agent", reason=reason)


def codes(cd) -> set[str]:
    return {f.code for f in cd.center.faults_of_node(NODE)}


def test_a_large_snapshot_splits_into_parts_that_merge_back_into_it():
    st = big_state(4_000)
    snap = st.snapshot(7)
    parts = snapshot_parts(snap, max_bytes=200_000)
    assert len(parts) > 5 and snap.ByteSize() > 5 * 200_000
    assert [(p.seq, p.part, p.parts) for p in parts] == [(7, i, len(parts)) for i in range(len(parts))]
    assert max(p.ByteSize() for p in parts) < 200_000 + 400  # the budget plus at most one fault
    assert parts[0].digest == snap.digest and parts[0].node_status == "UnHealthy"
    assert all(not p.digest and not p.conditions and not p.node_status for p in parts[1:])
    whole = agent_pb2.Snapshot()
    for p in parts:
        whole.MergeFrom(p)
    whole.ClearField("part")
    whole.ClearField("parts")
    assert whole == snap
    assert snapshot_parts(snap, max_bytes=snap.ByteSize()) == [snap]  # small enough: one message


async def test_a_state_of_several_mib_reaches_clusterd_whole_and_resyncs_by_digest(cd):
    st = big_state()
    assert st.snapshot(1).ByteSize() > 3 * (4 << 20)  # three times the receive limit
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", state=st)
    await client.start()
    try:
        await client.wait_synced(120)
        assert codes(cd) == {f"{i:08X}" for i in range(40_000)}
        held = cd.center.faults_of_node(NODE)
        assert all(f.attributes == ATTRS for f in held)
        assert cd.agents.node_info(NODE)["node_status"] == "UnHealthy"
        parts = client.metrics.sent.labels("snapshot_part")._value.get()
        assert parts > 12  # about 1 MiB a part
        assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="complete") == parts
        assert sample(cd, "faultmesh_agent_snapshots_total", result="full") == 1
        assert sample(cd, "faultmesh_agent_snapshot_parts_held_bytes") == 0
        assert client.metrics.reconnects._value.get() == 1, client.down_reason
    finally:
        await client.stop()
    # the digest covers the whole state: the next session of an unchanged agent sends no parts
    again = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", state=st)
    await again.start()
    try:
        await again.wait_synced(60)
        assert sample(cd, "faultmesh_agent_snapshots_total", result="unchanged") == 1
        assert again.metrics.sent.labels("snapshot_part")._value.get() == 0
        assert len(codes(cd)) == 40_000
    finally:
        await again.stop()


async def test_a_stream_cut_between_parts_leaves_the_previous_state_and_the_next_session_completes_it(cd):
    before = AgentState(NODE)
    for i in range(100_000, 100_003):
        before.upsert(fault(i))
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", state=before)
    await client.start()
    await client.wait_synced()
    await client.stop()
    previous = codes(cd)
    assert previous == {f"{i:08X}" for i in range(100_000, 100_003)}

    st = big_state(12_000)
    parts = snapshot_parts(st.snapshot(1))
    assert len(parts) == 4
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        assert (SNAPSHOT_MAX_BYTES_HEADER, str(64 << 20)) in tuple(await call.initial_metadata())
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, agent="noded")))
        for p in parts[:3]:  # the last part never comes
            await call.write(agent_pb2.AgentMessage(snapshot=p))
        held = sum(p.ByteSize() for p in parts[:3])
        await eventually(
            lambda: sample(cd, "faultmesh_agent_snapshot_parts_held_bytes") == held, 30, "3 parts held"
        )
        assert codes(cd) == previous  # nothing applied before the last part
        call.cancel()
    await eventually(lambda: (NODE, "noded") not in cd.agents.connected(), 30, "the stream gone")
    assert sample(cd, "faultmesh_agent_snapshot_parts_held_bytes") == 0
    assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="dropped") == 3
    assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="complete") == 0
    assert codes(cd) == previous

    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", state=st)
    await client.start()
    try:
        await client.wait_synced(60)
        assert codes(cd) == {f"{i:08X}" for i in range(12_000)}  # the previous three recovered
        assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="complete") == 4
    finally:
        await client.stop()


async def talk(cd, messages, until, timeout_s: float = 30.0) -> tuple[list, bool]:
    """Send ``messages`` on one raw stream; read the replies until ``until(replies)`` or the server
    ends the stream. Returns (replies, ended)."""
    replies: list = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        for m in messages:
            await call.write(m)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not until(replies):
            msg = await asyncio.wait_for(call.read(), max(0.1, deadline - loop.time()))
            if msg is grpc.aio.EOF:
                return replies, True
            replies.append(msg)
        call.cancel()
    return replies, False


def acks(replies) -> dict[int, str]:
    return {r.ack.seq: r.ack.error for r in replies if r.WhichOneof("body") == "ack"}


HELLO = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, agent="noded"))


def msgs(parts) -> list[agent_pb2.AgentMessage]:
    return [agent_pb2.AgentMessage(snapshot=p) for p in parts]


async def test_a_snapshot_over_clusterds_bounds_is_refused_whole_and_the_stream_goes_on(cd):
    cd.agents.parts.max_bytes = 2 << 20
    parts = snapshot_parts(big_state(12_000).snapshot(1))
    delta = agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2, upserts=[agent_pb2.Fault(
        source="bmc-oem", device_type="CPU", device_id=1, code="0000AAAA", level="SeparateFault")]))  # fmt: skip
    replies, ended = await talk(cd, [HELLO, *msgs(parts), delta], lambda r: 2 in acks(r))
    assert not ended
    assert acks(replies)[1].startswith(
        "snapshot_too_large: snapshot seq 1 of node node-1: over 2097152 bytes"
    )
    assert acks(replies)[2] == ""  # the stream goes on: the parts after the refusal were discarded
    assert codes(cd) == {"0000AAAA"}
    assert rejected(cd, "snapshot_too_large") == 1
    assert sample(cd, "faultmesh_agent_snapshot_parts_held_bytes") == 0

    cd.agents.parts.max_parts = 3  # too many parts: refused at part 0
    replies, ended = await talk(cd, [HELLO, *msgs(parts)], lambda r: 1 in acks(r))
    assert acks(replies)[1].endswith(f"{len(parts)} parts, limit 3") and not ended
    assert codes(cd) == {"0000AAAA"}


async def test_the_agent_sends_no_state_over_what_clusterd_collects(cd, caplog):
    cd.agents.parts.max_bytes = 2 << 20  # advertised in the response headers
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", state=big_state(12_000))
    await client.start()
    try:
        await eventually(lambda: "state too large for clusterd" in client.down_reason, 30, "the reason")
        assert "bytes > 2097152" in client.down_reason
        assert any("state too large for clusterd" in r.getMessage() for r in caplog.records)
        assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="dropped") == 0  # none sent
        assert codes(cd) == set()
    finally:
        await client.stop()


async def test_parts_out_of_order_or_a_delta_between_them_end_the_stream_with_a_resync(cd):
    parts = snapshot_parts(big_state(8_000).snapshot(1))
    delta = agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2))
    cases = [
        [parts[0], parts[2]],  # a part skipped
        [parts[1]],  # no part 0
        [parts[0], delta],  # a Delta between parts
    ]
    for n, case in enumerate(cases, 1):
        sent = [agent_pb2.AgentMessage(snapshot=m) if isinstance(m, agent_pb2.Snapshot) else m for m in case]
        replies, ended = await talk(cd, [HELLO, *sent], lambda r: False)
        assert ended and any(e.startswith("resync: snapshot_part_order: ") for e in acks(replies).values())
        assert rejected(cd, "snapshot_part_order") == n
        await eventually(lambda: sample(cd, "faultmesh_agent_snapshot_parts_held_bytes") == 0, 30, "freed")
    assert codes(cd) == set()


async def test_parts_over_what_all_streams_may_hold_are_refused_for_a_later_try(cd):
    cd.agents.parts.max_held_bytes = 2 << 20
    parts = snapshot_parts(big_state(12_000).snapshot(1))
    replies, ended = await talk(cd, [HELLO, *msgs(parts)], lambda r: False)
    assert ended and acks(replies)[1].startswith("resync: snapshot_parts_busy: ")
    assert rejected(cd, "snapshot_parts_busy") == 1 and codes(cd) == set()
    assert sample(cd, "faultmesh_agent_snapshot_parts_held_bytes") == 0


def test_the_agent_reads_what_clusterd_collects_from_its_response_headers():
    from faultmesh.wire import snapshot_max_bytes

    assert (
        snapshot_max_bytes([("content-type", "application/grpc"), (SNAPSHOT_MAX_BYTES_HEADER, "1048576")])
        == 1 << 20
    )
    assert snapshot_max_bytes([(SNAPSHOT_MAX_BYTES_HEADER, b"2048")]) == 2048
    for bad in ("", "-1", "1e9", "x", "9" * 30):  # an older or a broken ClusterD: no parts
        assert snapshot_max_bytes([(SNAPSHOT_MAX_BYTES_HEADER, bad)]) == 0
    assert snapshot_max_bytes(None) == snapshot_max_bytes(()) == 0


async def test_parts_of_a_stream_gone_stale_are_dropped(tmp_path):
    from support import make_clusterd

    cd = await make_clusterd(tmp_path, "--agent-stale-after-s", "2")
    parts = msgs(snapshot_parts(big_state(8_000).snapshot(1)))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
            for m in [HELLO, *parts[:2]]:
                await call.write(m)
            await eventually(lambda: held_bytes(cd) > 0, 30, "parts held")
            # silent past --agent-stale-after-s (a hung agent): what it held goes
            await eventually(lambda: held_bytes(cd) == 0, 30, "freed")
            assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="dropped") == 2
            await call.write(parts[2])  # the rest of that snapshot no longer follows anything
            replies = []
            while (msg := await asyncio.wait_for(call.read(), 30)) is not grpc.aio.EOF:
                replies.append(msg)
            assert acks(replies)[1].startswith("resync: snapshot_part_order: snapshot part 2 of 3 without")
        assert codes(cd) == set()
    finally:
        await cd.stop()


def held_bytes(cd) -> float:
    return sample(cd, "faultmesh_agent_snapshot_parts_held_bytes")


async def test_parts_of_a_stream_taken_over_are_dropped_and_the_new_streams_snapshot_rules(cd):
    st = big_state(8_000)
    parts = msgs(snapshot_parts(st.snapshot(1)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        for m in [HELLO, *parts[:2]]:
            await call.write(m)
        await eventually(lambda: held_bytes(cd) > 0, 30, "parts held")
        client = AgentClient(f"127.0.0.1:{cd.grpc_port}", NODE, "noded", state=st)
        await client.start()
        try:
            await client.wait_synced(60)
            assert len(codes(cd)) == 8_000
            assert held_bytes(cd) == 0
            assert sample(cd, "faultmesh_agent_snapshot_parts_total", result="dropped") == 2
            assert sample(cd, "faultmesh_agent_stream_takeovers_total", reason="restart") == 1
        finally:
            await client.stop()
        call.cancel()
