"""Agent-stream sequence numbers and node expiry (issue 19 #6).

A Delta must carry the previous seq + 1, a Snapshot any larger seq; a gap, a replay or an old message
is not applied, counted, acked with ``resync:`` and the stream ends, so the agent resends all by
snapshot. An agent without a stream for ``--agent-expire-after-s`` is dropped with its faults, the
node with its last agent (views, metrics, the stored state); it comes back cleanly on reconnect.
"""

from __future__ import annotations

import aiohttp
from support import agent_stream, eventually, make_clusterd

from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentClient
from faultmesh.model import Fault


def _f(i: int) -> agent_pb2.Fault:
    return agent_pb2.Fault(
        source="bmc-oem", device_type="CPU", device_id=i, code=f"{i:08X}", level="SeparateFault"
    )


def _hello(node: str = "node-1") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent="noded"))


def _snap(seq: int, *faults) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=seq, faults=list(faults)))


def _delta(seq: int, *ups, removals=()) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, upserts=list(ups), removals=list(removals)))


async def stream(port: int, messages) -> tuple[dict[int, str], bool]:
    """Send ``messages``; (seq -> ack error, whether the server ended the stream)."""
    replies, ended = await agent_stream(port, messages)
    return {m.ack.seq: m.ack.error for m in replies if m.WhichOneof("body") == "ack"}, ended


def hw(code: str, dev: int = 1, node: str = "node-1", source: str = "bmc-oem") -> Fault:
    return Fault(source=source, node=node, device_type="CPU", device_id=dev, code=code, level="SeparateFault")


def rejected(cd, reason: str) -> float:
    return (
        cd.registry.get_sample_value(
            "faultmesh_rejected_requests_total", {"service": "agent", "reason": reason}
        )
        or 0.0
    )


def codes(cd, node: str = "node-1") -> list[str]:
    return sorted(f.code for f in cd.center.faults(node))


async def test_the_next_delta_seq_is_applied_and_a_gap_is_refused_with_a_resync(cd):
    acks, ended = await stream(
        cd.grpc_port, [_hello(), _snap(1), _delta(2, _f(1)), _delta(3, _f(2)), _delta(5, _f(3))]
    )
    assert acks[1] == acks[2] == acks[3] == ""  # last + 1: in order
    assert acks[5].startswith("resync: seq_gap")  # last + 2: a gap
    assert ended and codes(cd) == ["00000001", "00000002"]
    assert rejected(cd, "seq_gap") == 1


async def test_a_replayed_or_old_message_is_not_applied(cd):
    rm = agent_pb2.FaultKey(source="bmc-oem", device_type="CPU", device_id=1, code="00000001")
    acks, ended = await stream(
        cd.grpc_port, [_hello(), _snap(1), _delta(2, _f(1)), _delta(3, removals=[rm]), _delta(2, _f(1))]
    )
    assert acks[3] == "" and acks[2].startswith("resync: seq_replay")
    assert ended and codes(cd) == []  # the replayed upsert did not bring the removed fault back
    acks, ended = await stream(cd.grpc_port, [_hello(), _snap(7), _snap(7, _f(4))])
    assert acks[7].startswith("resync: seq_replay") and codes(cd) == []
    assert rejected(cd, "seq_replay") == 2


async def test_a_snapshot_may_skip_ahead_a_delta_may_not(cd):
    acks, ended = await stream(cd.grpc_port, [_hello(), _snap(1), _snap(9, _f(1)), _delta(10, _f(2))])
    assert acks == {1: "", 9: "", 10: ""} and not ended
    assert codes(cd) == ["00000001", "00000002"]


async def test_the_agent_resyncs_by_snapshot_after_a_refused_seq(cd):
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", backoff_max_s=0.5)
    client.state.upsert(hw("00000001"))
    await client.start()
    try:
        await client.wait_synced()
        client.seq += 3  # as if three deltas were lost on the way
        client.state.upsert(hw("2", dev=2))
        await eventually(lambda: codes(cd) == ["00000001", "2"])
        assert rejected(cd, "seq_gap") == 1
        assert client.metrics.reconnects._value.get() >= 2  # the refused seq ended the session
    finally:
        await client.stop()


async def nodes_view(cd) -> dict[str, dict]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{cd.http.port}/v1/nodes") as r:
        return {n["name"]: n for n in await r.json()}


async def grid_names(cd) -> set[str]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{cd.http.port}/v1/grid") as r:
        return {n["name"] for n in (await r.json())["nodes"]}


async def metrics_text(cd) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{cd.http.port}/metrics") as r:
        return await r.text()


async def test_an_agent_gone_past_the_expiry_is_dropped_with_its_node_and_comes_back_cleanly(tmp_path):
    cd = await make_clusterd(tmp_path, "--agent-expire-after-s", "100")
    try:
        t0 = cd.nodes.clock()
        cd.nodes.clock = lambda: t0
        for node in ("node-1", "node-2"):
            acks, _ = await stream(cd.grpc_port, [_hello(node), _snap(1, _f(1))])
            assert acks == {1: ""}
        public = hw("X1", node="node-2", source="public:disk")
        await cd.center.upsert(public, origin="public")
        await eventually(lambda: not cd.agents.sessions)
        cd.nodes.clock = lambda: t0 + 100  # at the limit: kept
        assert await cd.agents.liveness.expire() == 0
        assert set(await nodes_view(cd)) >= {"node-1", "node-2"}
        cd.nodes.clock = lambda: t0 + 100.5  # past it: dropped
        assert await cd.agents.liveness.expire() == 2
        view = await nodes_view(cd)
        assert "node-1" not in view  # no agent, no faults of any other origin: gone
        assert "node-1" not in await grid_names(cd)  # the web view agrees
        assert codes(cd, "node-1") == [] and codes(cd, "node-2") == ["X1"]  # the public fault stays
        assert cd.nodes.get("node-2") is None and cd.agents.node_info("node-1") == {}
        text = await metrics_text(cd)
        assert 'node="node-1"' not in text and "faultmesh_agents_expired_total 2.0" in text
        acks, _ = await stream(cd.grpc_port, [_hello("node-1"), _snap(1, _f(2))])  # back, cleanly
        assert acks == {1: ""} and codes(cd, "node-1") == ["00000002"]
        back = (await nodes_view(cd))["node-1"]
        assert back["faults"] == 1
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path, "--agent-expire-after-s", "100")  # the stored state agrees
    try:
        assert cd.nodes.get("node-1") is not None and cd.nodes.get("node-2") is None
    finally:
        await cd.stop()


async def test_a_connected_agent_never_expires(tmp_path):
    cd = await make_clusterd(tmp_path, "--agent-expire-after-s", "100")
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    client.state.upsert(hw("1"))
    await client.start()
    try:
        await client.wait_synced()
        t0 = cd.nodes.clock()
        cd.nodes.clock = lambda: t0 + 10_000
        assert await cd.agents.liveness.expire() == 0 and codes(cd) == ["1"]
    finally:
        await client.stop()
        await cd.stop()
