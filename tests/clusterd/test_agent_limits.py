"""Every documented agent-stream limit holds at the limit and is refused at limit + 1 (issue 19 #6)."""

from __future__ import annotations

import grpc
import pytest
from support import agent_stream

from clusterd.ingest import agentinput
from clusterd.ingest import agents as agents_mod
from faultmesh._pb import agent_pb2


async def raw_stream(port: int, messages) -> list[agent_pb2.ControlMessage]:
    """Send ``messages`` on one stream; what comes back until the server is quiet for 1 s."""
    return (await agent_stream(port, messages))[0]


def _hello(agent: str = "noded") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", agent=agent))


def _f(i: int, code: str | None = None) -> agent_pb2.Fault:
    return agent_pb2.Fault(
        source="bmc-oem", device_type="CPU", device_id=i, code=code or f"{i:08X}", level="SeparateFault"
    )


def _errors(acks) -> dict[int, str]:
    return {a.ack.seq: a.ack.error for a in acks if a.WhichOneof("body") == "ack"}


async def test_faults_per_message_at_the_limit_and_over_it(cd, monkeypatch):
    monkeypatch.setattr(agents_mod, "MAX_FAULTS_PER_MESSAGE", 3)
    acks = await raw_stream(
        cd.grpc_port,
        [
            _hello(),
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[_f(i) for i in range(3)])),
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=2, faults=[_f(i) for i in range(4)])),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=3, upserts=[_f(9)] * 2)),
            agent_pb2.AgentMessage(
                delta=agent_pb2.Delta(
                    seq=4, upserts=[_f(7), _f(8)], removals=[agent_pb2.FaultKey(code="1")] * 2
                )
            ),
        ],
    )
    errs = _errors(acks)
    assert errs[1] == "" and errs[3] == ""
    assert errs[2].startswith("too_many_faults") and errs[4].startswith("too_many_faults")
    assert sorted(f.device_id for f in cd.center.faults("node-1")) == [0, 1, 2, 9]


async def test_faults_per_node_count_what_the_agent_would_hold_there(cd, monkeypatch):
    """A Delta that would leave more than MAX_FAULTS_PER_NODE faults of the agent on its node is
    refused (restating held faults and removing some to make room are fine); so is a Snapshot over
    it. What was refused is not stored."""
    monkeypatch.setattr(agents_mod, "MAX_FAULTS_PER_NODE", 4)
    rm = agent_pb2.FaultKey(source="bmc-oem", device_type="CPU", device_id=0, code=f"{0:08X}")
    acks = await raw_stream(
        cd.grpc_port,
        [
            _hello(),
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1, faults=[_f(i) for i in range(3)])),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2, upserts=[_f(0), _f(1), _f(3)])),  # 4: ok
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=3, upserts=[_f(5)])),  # 5: refused
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=4, upserts=[_f(5)], removals=[rm])),  # 4
            agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=5, faults=[_f(i) for i in range(5)])),
        ],
    )
    errs = _errors(acks)
    assert errs[1] == errs[2] == errs[4] == "", errs
    assert errs[3] == "too_many_faults: node node-1 would hold 5 faults, limit 4 per agent", errs
    assert errs[5] == "too_many_faults: 5 faults for node node-1, limit 4 per agent", errs
    assert sorted(f.device_id for f in cd.center.faults("node-1")) == [1, 2, 3, 5]


async def test_conditions_per_node_count_what_the_node_would_hold(cd):
    first = [agent_pb2.Condition(type=f"c{i}", active=True) for i in range(64)]
    acks = await raw_stream(
        cd.grpc_port,
        [
            _hello(),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=1, conditions=first)),  # at the limit
            agent_pb2.AgentMessage(
                delta=agent_pb2.Delta(seq=2, conditions=[agent_pb2.Condition(type="c0", active=False)])
            ),  # an update of a known one
            agent_pb2.AgentMessage(
                delta=agent_pb2.Delta(seq=3, conditions=[agent_pb2.Condition(type="c64", active=True)])
            ),  # the 65th
        ],
    )
    errs = _errors(acks)
    assert errs[1] == "" and errs[2] == "" and errs[3].startswith("bad_state")
    assert len(cd.agents.node_info("node-1")["conditions"]) == 64


@pytest.mark.parametrize("agent", ["noded\n", "a" * 33])
async def test_agent_names_are_matched_whole(cd, agent):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await raw_stream(cd.grpc_port, [_hello(agent)])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_agent_name_at_the_length_limit_is_accepted(cd):
    acks = await raw_stream(
        cd.grpc_port, [_hello("a" * 32), agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1))]
    )
    assert _errors(acks) == {1: ""}


async def test_a_code_with_a_trailing_newline_is_refused(cd):
    acks = await raw_stream(
        cd.grpc_port,
        [_hello(), agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=1, upserts=[_f(0, "0000000A\n")]))],
    )
    assert _errors(acks)[1].startswith("bad_fault")
    assert cd.center.faults() == []


async def test_devices_per_node_count_what_the_node_would_hold(cd, monkeypatch):
    monkeypatch.setattr(agentinput, "MAX_DEVICES", 3)

    def dev(i: int) -> agent_pb2.DeviceState:
        return agent_pb2.DeviceState(device_type="NPU", device_id=i, health="Healthy")

    acks = await raw_stream(
        cd.grpc_port,
        [
            _hello(),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=1, devices=[dev(0), dev(1)])),
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2, devices=[dev(2)])),  # the 3rd: at the limit
            agent_pb2.AgentMessage(
                delta=agent_pb2.Delta(seq=3, devices=[dev(0)])
            ),  # an update of a known one
            agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=4, devices=[dev(3)])),  # the 4th
        ],
    )
    errs = _errors(acks)
    assert errs[1] == errs[2] == errs[3] == "" and errs[4].startswith("bad_state")
    assert len(cd.agents.node_info("node-1")["devices"]) == 3


async def test_devices_of_messages_still_committing_count_toward_the_limit(cd, monkeypatch):
    # each delta carries a fault too: it is applied to the node only once its fault is durable, and
    # the next message is read meanwhile (pipelined); the 4th device must be refused all the same
    monkeypatch.setattr(agentinput, "MAX_DEVICES", 3)

    def delta(seq: int, *ids: int) -> agent_pb2.AgentMessage:
        devices = [agent_pb2.DeviceState(device_type="NPU", device_id=i, health="Healthy") for i in ids]
        return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, devices=devices, upserts=[_f(seq)]))

    acks = await raw_stream(cd.grpc_port, [_hello(), delta(1, 0, 1), delta(2, 2), delta(3, 3), delta(4, 1)])
    errs = _errors(acks)
    assert errs[1] == errs[2] == errs[4] == "" and errs[3].startswith("bad_state")
    assert len(cd.agents.node_info("node-1")["devices"]) == 3
