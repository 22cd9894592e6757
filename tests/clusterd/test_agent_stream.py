"""The agent stream seen from both ends: AgentClient (as NodeD/deviced use it) against a real ClusterD."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from support import eventually, make_clusterd

from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient
from faultmesh.model import Fault


def hw(code: str, dev: int = 0, level: str = "SeparateFault", source: str = "bmc-oem") -> Fault:
    return Fault(source=source, node="node-1", device_type="Memory", device_id=dev, code=code, level=level)


async def test_snapshot_deltas_and_recover_reach_the_fault_center(cd):
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    client.state.upsert(hw("00000001"))
    await client.start()
    try:
        await client.wait_synced()
        assert [f.code for f in cd.center.faults("node-1")] == ["00000001"]
        first_seen = cd.center.faults("node-1")[0].first_seen_ms
        client.state.replace_source("bmc-oem", [hw("00000001"), hw("00000002", dev=1)])
        await client.wait_synced()
        assert [f.code for f in cd.center.faults("node-1")] == ["00000001", "00000002"]
        assert cd.center.faults("node-1")[0].first_seen_ms == first_seen
        client.state.remove(hw("00000001").key)
        client.state.set_condition("BMCUnreachable", True, "timeout")
        await client.wait_synced()
        assert [f.code for f in cd.center.faults("node-1")] == ["00000002"]
        assert cd.agents.node_info("node-1")["conditions"]["BMCUnreachable"]["active"] is True
    finally:
        await client.stop()


async def test_faults_survive_a_clusterd_restart_and_the_agent_resyncs(tmp_path):
    cd = await make_clusterd(tmp_path)
    port = cd.grpc_port
    client = AgentClient(f"127.0.0.1:{port}", "node-1", "noded", backoff_max_s=0.5)
    client.state.upsert(hw("00000001"))
    await client.start()
    try:
        await client.wait_synced()
        first_seen = cd.center.faults()[0].first_seen_ms
        await cd.stop()
        # while clusterd is down the node recovers one fault and raises another
        client.state.remove(hw("00000001").key)
        client.state.upsert(hw("00000003", dev=2))
        cd = await make_clusterd(tmp_path, "--grpc-addr", f"127.0.0.1:{port}")
        # restored from the state file first, then the agent's snapshot replaces it
        await eventually(lambda: [f.code for f in cd.center.faults()] == ["00000003"])
        assert cd.center.faults()[0].first_seen_ms > first_seen
    finally:
        await client.stop()
        await cd.stop()


async def test_restored_fault_keeps_its_first_seen_time(tmp_path):
    cd = await make_clusterd(tmp_path)
    port = cd.grpc_port
    client = AgentClient(f"127.0.0.1:{port}", "node-1", "noded", backoff_max_s=0.5)
    client.state.upsert(hw("00000001"))
    await client.start()
    await client.wait_synced()
    first_seen = cd.center.faults()[0].first_seen_ms
    await cd.stop()
    cd = await make_clusterd(tmp_path, "--grpc-addr", f"127.0.0.1:{port}")
    try:
        assert [(f.code, f.first_seen_ms) for f in cd.center.faults()] == [("00000001", first_seen)]
        await eventually(lambda: ("node-1", "noded") in cd.agents.connected())
        await client.wait_synced()
        assert [(f.code, f.first_seen_ms) for f in cd.center.faults()] == [("00000001", first_seen)]
    finally:
        await client.stop()
        await cd.stop()


async def test_control_messages_reach_the_agent_and_are_acked(cd):
    got: list[agent_pb2.ControlMessage] = []

    async def on_control(msg):
        got.append(msg)

    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", on_control=on_control)
    await client.start()
    try:
        await eventually(lambda: ("node-1", "noded") in cd.agents.connected())
        cfg = agent_pb2.PingmeshConfig(
            activations={"global": agent_pb2.PingmeshActivation(activate=True, task_interval_s=5)}
        )
        assert await cd.agents.send("node-1", "noded", pingmesh_config=cfg)
        await eventually(lambda: len(got) == 1)
        assert got[0].pingmesh_config.activations["global"].task_interval_s == 5
        await eventually(lambda: cd.agents.sessions[("node-1", "noded")].acked_control == got[0].seq)
        assert not await cd.agents.send("node-2", "noded", pingmesh_config=cfg)
    finally:
        await client.stop()


async def raw_stream(port: int, messages: list[agent_pb2.AgentMessage]) -> list[agent_pb2.ControlMessage]:
    """Send raw messages on one stream and collect what comes back until the server is quiet."""
    out = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        for m in messages:
            await call.write(m)
        try:
            while True:
                msg = await asyncio.wait_for(call.read(), 1.0)
                if msg is grpc.aio.EOF:
                    break
                out.append(msg)
        except TimeoutError:
            pass
        call.cancel()
    return out


async def test_stream_without_hello_is_refused(cd):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await raw_stream(cd.grpc_port, [agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1))])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert cd.rejected.labels("agent", "no_hello")._value.get() == 1
    assert e.value.details() == "first message must be Hello with a node"


@pytest.mark.parametrize("node", ["", "node 1", "n" * 254, "node/1", "nöde-1"])
async def test_hello_with_an_invalid_node_name_says_the_rule(cd, node):
    # tryout: it said "first message must be Hello with a node", as for a stream without a Hello
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent="noded"))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await raw_stream(cd.grpc_port, [hello])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == f"Hello: node must match [A-Za-z0-9._-]{{1,253}}, got {node[:64]!r}"
    assert cd.rejected.labels("agent", "no_hello")._value.get() == 1  # the reason stays no_hello
    assert cd.agents.connected() == []


async def test_bad_faults_are_rejected_with_a_reason_and_do_not_touch_state(cd):
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", agent="noded"))
    foreign = agent_pb2.Fault(source="bmc-oem", node="node-2", device_type="CPU", device_id=0, code="1")
    good = agent_pb2.Fault(
        source="bmc-oem", device_type="CPU", device_id=0, code="00000001", level="SeparateFault"
    )
    bad_assertion = agent_pb2.Fault(source="x", device_type="CPU", code="2", assertion="sometimes")
    acks = await raw_stream(
        cd.grpc_port,
        [
            hello,
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[good])),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2, upserts=[foreign])),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=3, upserts=[bad_assertion])),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=4, removals=[agent_pb2.FaultKey(code="nope")])),
        ],
    )
    by_seq = {a.ack.seq: a.ack.error for a in acks if a.WhichOneof("body") == "ack"}
    assert by_seq[1] == "" and by_seq[4] == ""
    assert by_seq[2].startswith("foreign_node") and by_seq[3].startswith("bad_fault")
    assert [f.code for f in cd.center.faults()] == ["00000001"]
    assert cd.rejected.labels("agent", "foreign_node")._value.get() == 1


async def test_a_peer_vanishing_mid_stream_costs_nothing(cd):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-9", agent="deviced")))
        f = agent_pb2.Fault(
            source="dcmi", device_type="NPU", device_id=3, code="80E01801", level="RestartNPU"
        )
        await call.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[f])))
        await asyncio.wait_for(call.read(), 5)
        call.cancel()
    await eventually(lambda: cd.agents.connected() == [])
    assert [f.code for f in cd.center.faults("node-9")] == ["80E01801"]  # the agent is the truth; kept
    # clusterd still serves others
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    client.state.upsert(hw("00000001"))
    await client.start()
    await client.wait_synced()
    await client.stop()
    assert len(cd.center.faults()) == 2


@pytest.mark.parametrize(
    "fault, why",
    [
        (dict(level="Apocalypse"), "unknown fault level"),
        (dict(code="\x00\x01<>"), "code"),
        (dict(code="a b"), "code"),
        (dict(first_seen_ms=-(2**63)), "time out of range"),
        (dict(last_seen_ms=2**63 - 1), "time out of range"),
    ],
)
async def test_junk_fault_fields_are_rejected(cd, fault, why):
    base = dict(source="bmc-oem", device_type="CPU", device_id=0, code="00000001", level="SeparateFault")
    base.update(fault)
    acks = await raw_stream(
        cd.grpc_port,
        [
            agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", agent="noded")),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=1, upserts=[agent_pb2.Fault(**base)])),
        ],
    )
    errors = [a.ack.error for a in acks if a.WhichOneof("body") == "ack"]
    assert errors and why in errors[0]
    assert cd.center.faults() == []


async def test_state_caps_and_agent_names(cd):
    many = [agent_pb2.Condition(type=f"c{i}", active=True) for i in range(65)]
    acks = await raw_stream(
        cd.grpc_port,
        [
            agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", agent="noded")),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=1, conditions=many)),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2, node_status="x" * 1000)),
        ],
    )
    errors = [a.ack.error for a in acks if a.WhichOneof("body") == "ack"]
    assert errors[0].startswith("bad_state") and errors[1].startswith("bad_state")
    assert cd.agents.node_info("node-1")["conditions"] == {}
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await raw_stream(
            cd.grpc_port, [agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="n", agent="X" * 1000))]
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
