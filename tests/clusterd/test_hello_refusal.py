"""A refused Hello names the field that broke its limit: ``bad_hello`` covers the agent name, a
``node_ip`` over 64 characters, a ``node_sn`` over 128 and labels over their limits (32 labels, keys
of 1..63, values of at most 256 characters), and the message used to say only "agent
must match" for all three (session notes)."""

from __future__ import annotations

import grpc
import pytest

from clusterd.ingest.hello import hello_refusal
from faultmesh._pb import agent_pb2, agent_pb2_grpc


def labels_refused(n: int) -> tuple[str, str]:
    return "bad_hello", (
        f"Hello: at most 32 labels, keys of 1..63 and values of at most 256 characters, got {n} labels"
    )


def _hello(**fields) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(hello=agent_pb2.Hello(**{"node": "node-1", "agent": "noded", **fields}))


@pytest.mark.parametrize(
    "fields, refusal",
    [
        ({}, None),
        ({"node_ip": "1" * 64, "node_sn": "S" * 128}, None),  # at the limits
        ({"agent": "Noded"}, ("bad_hello", "Hello: agent must match [a-z][a-z0-9_-]{0,31}, got 'Noded'")),
        ({"node_ip": "1" * 65}, ("bad_hello", "Hello: node_ip must be at most 64 characters, got 65")),
        ({"node_sn": "S" * 129}, ("bad_hello", "Hello: node_sn must be at most 128 characters, got 129")),
        ({"node": "a b"}, ("no_hello", "Hello: node must match [A-Za-z0-9._-]{1,253}, got 'a b'")),
        ({"labels": {f"k{i}": "v" * 256 for i in range(32)} | {"g" * 63: ""}}, labels_refused(33)),
        ({"labels": {f"k{i}": "v" * 256 for i in range(32)}}, None),  # at the limits
        ({"labels": {"graceTolerance": "v" * 257}}, labels_refused(1)),
        ({"labels": {"g" * 64: "on"}}, labels_refused(1)),
        ({"labels": {"": "on"}}, labels_refused(1)),
    ],
)
def test_hello_refusal_names_the_field(fields, refusal):
    assert hello_refusal(_hello(**fields)) == refusal


def test_a_first_message_that_is_no_hello():
    first = agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1))
    assert hello_refusal(first) == ("no_hello", "first message must be Hello with a node")


async def test_the_agent_is_told_which_field(cd):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
        await call.write(_hello(node_sn="S" * 129))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
    assert (e.value.code(), e.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Hello: node_sn must be at most 128 characters, got 129",
    )
    assert cd.rejected.labels("agent", "bad_hello")._value.get() == 1
    assert cd.nodes.get("node-1") is None
