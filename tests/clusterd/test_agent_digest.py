"""The unchanged resync (issue 18): an agent whose state clusterd already stored says so with the
digest of its snapshot instead of sending it; anything else takes the full snapshot. Seen from the
user's side: the node's faults and view, and ``faultmesh_agent_snapshots_total{result}``."""

from __future__ import annotations

import asyncio
import re
import sqlite3

import aiohttp
import grpc
from support import eventually, make_clusterd

from clusterd.ingest.resync import DIGEST_SIZE
from faultmesh import agent as agent_mod
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient, AgentState
from faultmesh.model import Fault
from faultmesh.wire import fault_to_pb

NODE = "node-1"
FAST_STOP = ("--drain-s", "0.1")  # a stop with agents connected waits this long for their streams


def npu(dev: int, level: str = "RestartNPU", code: str = "80E18008") -> Fault:
    return Fault(
        source="dcmi", node=NODE, device_type="NPU", device_id=dev, code=code, level=level,
        first_seen_ms=1_700_000_000_000 + dev, last_seen_ms=1_700_000_000_000 + dev,
    )  # fmt: skip


def fill(state: AgentState, health: str = "Healthy") -> None:
    """A deviced state: two faults, two NPUs, a condition."""
    state.upsert(npu(0))
    state.upsert(npu(1, "SeparateNPU"))
    for i in range(2):
        state.set_device(
            agent_pb2.DeviceState(device_type="NPU", device_id=i, phy_id=i, health=health, super_pod_id=-1)
        )
    state.set_condition("DCMIUnavailable", False)


async def snapshots(cd) -> dict[str, float]:
    """``faultmesh_agent_snapshots_total`` by result, as /metrics shows it."""
    url = f"http://127.0.0.1:{cd.http.port}/metrics"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        text = await r.text()
    got = re.findall(r'^faultmesh_agent_snapshots_total\{result="(\w+)"\} (\S+)$', text, re.M)
    return {k: float(v) for k, v in got}


def view(cd) -> tuple:
    """What a user reads of the node: its faults (with times) and its node view."""
    info = cd.agents.node_info(NODE)
    return (
        [(f.code, f.device_id, f.level, f.first_seen_ms, f.last_seen_ms) for f in cd.center.faults(NODE)],
        info["conditions"],
        info["devices"],
        cd.nodes.pending_sources(NODE),
    )


async def restart(cd, tmp_path, port: int):
    await cd.stop()
    return await make_clusterd(tmp_path, *FAST_STOP, "--grpc-addr", f"127.0.0.1:{port}")


async def test_restart_with_the_same_state_takes_the_digest_path(tmp_path):
    cd = await make_clusterd(tmp_path, *FAST_STOP)
    port = cd.grpc_port
    client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced", backoff_max_s=0.2, heartbeat_s=0)
    fill(client.state)
    await client.start()
    try:
        await client.wait_synced()
        assert await snapshots(cd) == {"full": 1.0, "unchanged": 0.0, "mismatch": 1.0}  # nothing stored yet
        before = view(cd)
        cd = await restart(cd, tmp_path, port)
        await eventually(lambda: (NODE, "deviced") in cd.agents.connected() and client.synced.is_set())
        await eventually(lambda: cd.agents._snap_unchanged._value.get() == 1)
        assert await snapshots(cd) == {"full": 0.0, "unchanged": 1.0, "mismatch": 0.0}
        # the first session learnt that this clusterd answers claims: the second one was the Hello alone
        sent = client.metrics.sent
        assert [sent.labels(k)._value.get() for k in ("digest", "snapshot", "delta")] == [2, 1, 0]
        assert view(cd) == before
        assert cd.nodes.get(NODE).stale == {}
        # the stream goes on with deltas on top of the held state
        client.state.upsert(npu(2))
        await client.wait_synced()
        assert [f.device_id for f in cd.center.faults(NODE)] == [0, 1, 2]
    finally:
        await client.stop()
        await cd.stop()


async def test_a_restarted_agent_with_the_same_state_matches_and_a_changed_one_does_not(cd):
    target = f"127.0.0.1:{cd.grpc_port}"
    first = AgentClient(target, NODE, "deviced")
    fill(first.state)
    await first.start()
    await first.wait_synced()
    await first.stop()
    # a new process (another boot id) holding the same state: the same faults with the same times,
    # the condition with the same since_ms (a real restart sets it anew: then it is another state)
    again = AgentClient(target, NODE, "deviced")
    fill(again.state)
    again.state.conditions = dict(first.state.conditions)
    assert again.hello.boot_id != first.hello.boot_id
    try:
        await again.start()
        await again.wait_synced()
        assert (await snapshots(cd))["unchanged"] == 1.0
    finally:
        await again.stop()
    changed = AgentClient(target, NODE, "deviced")
    fill(changed.state, health="UnHealthy")
    changed.state.conditions = dict(first.state.conditions)
    try:
        await changed.start()
        await changed.wait_synced()
        assert await snapshots(cd) == {"full": 2.0, "unchanged": 1.0, "mismatch": 2.0}
        assert {d["health"] for d in cd.agents.node_info(NODE)["devices"].values()} == {"UnHealthy"}
    finally:
        await changed.stop()


async def test_a_change_while_clusterd_was_down_takes_the_full_snapshot(tmp_path):
    cd = await make_clusterd(tmp_path, *FAST_STOP)
    port = cd.grpc_port
    client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced", backoff_max_s=0.2)
    fill(client.state)
    await client.start()
    try:
        await client.wait_synced()
        await cd.stop()
        client.state.remove(npu(0).key)  # recovered while clusterd was down
        client.state.set_condition("DCMIUnavailable", True, "Timeout", "dcmi_init hung")
        cd = await make_clusterd(tmp_path, *FAST_STOP, "--grpc-addr", f"127.0.0.1:{port}")
        await eventually(lambda: cd.agents._snap_full._value.get() == 1)
        await client.wait_synced()
        assert await snapshots(cd) == {"full": 1.0, "unchanged": 0.0, "mismatch": 1.0}
        assert [f.device_id for f in cd.center.faults(NODE)] == [1]
        assert cd.agents.node_info(NODE)["conditions"]["DCMIUnavailable"]["active"] is True
    finally:
        await client.stop()
        await cd.stop()


async def test_a_store_without_the_digest_or_an_older_agent_takes_the_full_snapshot(tmp_path):
    cd = await make_clusterd(tmp_path, *FAST_STOP)
    port = cd.grpc_port
    client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced", backoff_max_s=0.2)
    fill(client.state)
    await client.start()
    await client.wait_synced()
    await client.stop()
    await cd.stop()
    with sqlite3.connect(tmp_path / "state" / "clusterd.db") as db:  # a store that lost the digest
        assert db.execute("DELETE FROM scope_marks").rowcount == 1
    cd = await make_clusterd(tmp_path, *FAST_STOP, "--grpc-addr", f"127.0.0.1:{port}")
    try:
        client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced")
        fill(client.state)
        await client.start()
        await client.wait_synced()
        await client.stop()
        assert await snapshots(cd) == {"full": 1.0, "unchanged": 0.0, "mismatch": 1.0}
        old = AgentClient(f"127.0.0.1:{port}", NODE, "deviced", resync_by_digest=False)
        fill(old.state)
        old.state.snapshot = lambda seq, real=old.state.snapshot: _without_digest(real(seq))
        await old.start()  # an older agent: a snapshot without digest, no claim
        await old.wait_synced()
        await old.stop()
        assert await snapshots(cd) == {"full": 2.0, "unchanged": 0.0, "mismatch": 1.0}
        client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced")  # its snapshot left no digest
        fill(client.state)
        await client.start()
        await client.wait_synced()
        await client.stop()
        assert await snapshots(cd) == {"full": 3.0, "unchanged": 0.0, "mismatch": 2.0}
        assert len(cd.center.faults(NODE)) == 2
    finally:
        await cd.stop()


async def test_a_match_restores_the_node_view_its_snapshot_gave(tmp_path):
    """The node registry is flushed on its own clock: after a crash its row may be older than the
    faults and digest committed together. A match applies the view held with the digest."""
    cd = await make_clusterd(tmp_path, *FAST_STOP)
    port = cd.grpc_port
    client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced")
    fill(client.state)
    await client.start()
    await client.wait_synced()
    await client.stop()
    before, conditions = view(cd), dict(client.state.conditions)
    await cd.stop()
    with sqlite3.connect(tmp_path / "state" / "clusterd.db") as db:  # the row of an older flush
        (row,) = db.execute("SELECT state FROM nodes WHERE node=?", (NODE,)).fetchone()
        db.execute("UPDATE nodes SET state=? WHERE node=?", (row.replace('"Healthy"', '"UnHealthy"'), NODE))
    cd = await make_clusterd(tmp_path, *FAST_STOP, "--grpc-addr", f"127.0.0.1:{port}")
    try:
        assert {d["health"] for d in cd.agents.node_info(NODE)["devices"].values()} == {"UnHealthy"}
        client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced")
        fill(client.state)
        client.state.conditions = conditions  # the same state (the same since_ms)
        await client.start()
        await client.wait_synced()
        await client.stop()
        assert (await snapshots(cd))["unchanged"] == 1.0
        assert view(cd)[0] == before[0]
        assert view(cd)[2] == before[2]  # the devices as the agent's snapshot gave them
    finally:
        await cd.stop()


def _without_digest(snap: agent_pb2.Snapshot) -> agent_pb2.Snapshot:
    snap.digest = b""
    return snap


# -- the raw stream: what is acked --------------------------------------------------------------
async def exchange(port: int, *messages: agent_pb2.AgentMessage, replies: int, **hello) -> list:
    """Send Hello for (NODE, deviced) (with ``hello`` fields) and ``messages``; the first ``replies``
    acks (5 s at most)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=NODE, agent="deviced", **hello)))
        for m in messages:
            await call.write(m)
        out = []
        async with asyncio.timeout(5):
            while len(out) < replies:
                msg = await call.read()
                assert msg is not grpc.aio.EOF, out
                if msg.WhichOneof("body") == "ack":
                    out.append(msg.ack)
        call.cancel()
    return out


def claim(seq: int, digest: bytes, **more) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, snapshot_digest=digest, **more))


def snapshot(seq: int, digest: bytes, *faults: Fault) -> agent_pb2.AgentMessage:
    snap = agent_pb2.Snapshot(seq=seq, faults=[fault_to_pb(f) for f in faults], digest=digest)
    return agent_pb2.AgentMessage(snapshot=snap)


async def test_a_delta_after_the_snapshot_drops_its_digest_also_across_a_restart(tmp_path):
    cd = await make_clusterd(tmp_path, *FAST_STOP)
    port = cd.grpc_port
    d = b"\x01" * DIGEST_SIZE
    pushed = []  # on_connect: the control state clusterd pushes to a (re)synced agent
    cd.agents.on_connect(lambda node, agent: pushed.append((node, agent)))
    try:
        acks = await exchange(port, snapshot(1, d, npu(0)), replies=1)
        assert [(a.seq, a.error) for a in acks] == [(1, "")]
        assert [a.digest for a in await exchange(port, claim(1, d), replies=1)] == [agent_pb2.DIGEST_MATCH]
        assert pushed == [(NODE, "deviced")] * 2
        acks = await exchange(port, replies=1, snapshot_digest=d, claim_seq=5)  # the claim in the Hello
        assert [(a.seq, a.digest) for a in acks] == [(5, agent_pb2.DIGEST_MATCH)]
        # a delta changes the stored state: the digest no longer describes it
        up = agent_pb2.Delta(seq=2, upserts=[fault_to_pb(npu(3))])
        acks = await exchange(port, claim(1, d), agent_pb2.AgentMessage(delta=up), replies=2)
        assert [(a.seq, a.digest) for a in acks] == [(1, agent_pb2.DIGEST_MATCH), (2, 0)]
        cd = await restart(cd, tmp_path, port)
        acks = await exchange(port, claim(1, d), replies=1)  # even if the agent went back to that state
        assert [(a.seq, a.digest, a.error) for a in acks] == [(1, agent_pb2.DIGEST_MISMATCH, "")]
        assert [f.device_id for f in cd.center.faults(NODE)] == [0, 3]  # nothing acked away
    finally:
        await cd.stop()


async def test_a_snapshot_whose_commit_failed_leaves_no_digest(cd):
    d = b"\x03" * DIGEST_SIZE
    real = cd.store.write_faults

    async def failing(upserts=(), removals=(), marks=None):
        raise sqlite3.OperationalError("database or disk is full")

    cd.store.write_faults = failing
    acks = await exchange(cd.grpc_port, snapshot(1, d, npu(0)), replies=1)
    assert acks[0].error.startswith("internal:")
    cd.store.write_faults = real
    acks = await exchange(cd.grpc_port, claim(1, d), replies=1)
    assert [a.digest for a in acks] == [agent_pb2.DIGEST_MISMATCH]
    assert cd.center.faults(NODE) == []


async def test_a_malformed_or_unknown_digest_is_never_acked_as_a_match(cd):
    port = cd.grpc_port
    d = b"\x02" * DIGEST_SIZE
    acks = await exchange(
        port,
        claim(1, d),  # nothing stored for it
        claim(2, b"short"),
        claim(3, d, upserts=[fault_to_pb(npu(0))]),  # a claim carries nothing else
        snapshot(4, b"x" * 40, npu(0)),  # applied, but leaves no digest
        claim(5, b"x" * 40),
        replies=5,
    )
    assert [a.digest for a in acks] == [agent_pb2.DIGEST_MISMATCH] * 3 + [0, agent_pb2.DIGEST_MISMATCH]
    assert [a.error.split(":")[0] for a in acks] == ["", "bad_digest", "bad_digest", "", "bad_digest"]
    acks = await exchange(port, replies=1, claim_seq=3)  # a Hello claim without its digest
    assert [(a.seq, a.digest, a.error.split(":")[0]) for a in acks] == [
        (3, agent_pb2.DIGEST_MISMATCH, "bad_digest")
    ]
    assert [f.device_id for f in cd.center.faults(NODE)] == [0]
    assert cd.center.faults(NODE)[0].code == "80E18008"
    url = f"http://127.0.0.1:{cd.http.port}/metrics"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        text = await r.text()
    assert 'faultmesh_rejected_requests_total{reason="bad_digest",service="agent"} 5.0' in text
    assert await snapshots(cd) == {"full": 1.0, "unchanged": 0.0, "mismatch": 5.0}


async def test_an_older_clusterd_acks_the_claim_as_a_heartbeat_and_gets_the_full_snapshot():
    got: list[str] = []

    async def connect(request_iterator, context):  # a ClusterD without digests: acks every seq
        async for m in request_iterator:
            kind = m.WhichOneof("body")
            got.append(kind if kind != "delta" or m.delta.upserts else "empty delta")
            if kind in ("snapshot", "delta"):
                yield agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=getattr(m, kind).seq))

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "faultmesh.v1.AgentStream",
                {
                    "Connect": grpc.stream_stream_rpc_method_handler(
                        connect, agent_pb2.AgentMessage.FromString, agent_pb2.ControlMessage.SerializeToString
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced")
    fill(client.state)
    try:
        await client.start()
        await client.wait_synced()
        assert got == ["hello", "empty delta", "snapshot"]
        assert client.seq == 2 and client.acked_seq == 2
    finally:
        await client.stop()
    # an agent that saw a ClusterD answer claims puts the claim into its Hello; a downgraded one
    # answers nothing to it: the full snapshot follows after the ack timeout
    got.clear()
    client = AgentClient(f"127.0.0.1:{port}", NODE, "deviced", ack_timeout_s=0.3)
    client._digest_peer = True
    fill(client.state)
    try:
        await client.start()
        await client.wait_synced()
        assert got == ["hello", "snapshot"]
        assert client._digest_peer is False  # the next session sends the Delta claim again
    finally:
        await client.stop()
        await server.stop(None)


def test_the_digest_covers_everything_clusterd_stores_and_nothing_else():
    a, b = AgentState(NODE), AgentState(NODE)
    fill(a)
    for f in reversed([npu(0), npu(1, "SeparateNPU")]):  # another insertion order: the same state
        b.upsert(f)
    for i in reversed(range(2)):
        b.set_device(
            agent_pb2.DeviceState(device_type="NPU", device_id=i, phy_id=i, health="Healthy", super_pod_id=-1)
        )
    b.conditions = dict(a.conditions)
    da = a.snapshot(1).digest
    assert len(da) == agent_mod.DIGEST_SIZE == DIGEST_SIZE
    assert b.snapshot(7).digest == da  # the seq is not part of it
    changes = [
        lambda s: s.upsert(npu(0, "SeparateNPU")),
        # times are stored too (the agent keeps them while a fault's content stays the same)
        lambda s: s.faults.__setitem__(npu(1).key, npu(1, "SeparateNPU").with_times(1, 1)),
        lambda s: s.set_condition("DCMIUnavailable", True, "x"),
        lambda s: s.set_device(
            agent_pb2.DeviceState(device_type="NPU", device_id=0, phy_id=0, health="UnHealthy")
        ),
        lambda s: s.set_node_status("UnHealthy"),
        lambda s: s.expect_sources(["dcmi"]),
    ]
    seen = {da}
    for change in changes:
        c = AgentState(NODE)
        fill(c)
        c.conditions = dict(a.conditions)
        change(c)
        seen.add(c.snapshot(1).digest)
    assert len(seen) == len(changes) + 1
