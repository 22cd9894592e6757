"""An agent whose token ClusterD refuses says so (issue 35): one ``clusterd refused the token`` line
per attempt (one per backoff cycle), ``faultmesh_agent_token_refused_total`` counts them, and the
readiness text (noded's ``/readyz``) names the reason until a stream is up. Before, the agent logged
``clusterd stream down code=INTERNAL detail="Internal error from Core"`` in a good part of the tries
and its ``/readyz`` said only ``clusterd=down``."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import make_clusterd

from deviced.app import DeviceD
from deviced.app import build_parser as deviced_parser
from deviced.backends import SimBackend
from faultmesh import config
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient
from faultmesh.runtime import wait_for
from noded.app import NodeD, build_parser

TOKEN = "agent-token"


@pytest.fixture
async def cd(tmp_path):
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    c = await make_clusterd(tmp_path, "--token-file", str(tmp_path / "token"))
    yield c
    await c.stop()


async def _until(check, timeout_s: float = 20.0) -> None:
    async def poll():
        while not check():
            await asyncio.sleep(0.05)

    await wait_for(poll(), timeout_s)


def _series(registry: CollectorRegistry, name: str) -> float | None:
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.parametrize(
    "token, reason", [("nope", "bearer token does not match"), (None, "bearer token required")]
)
async def test_a_refused_token_is_logged_counted_and_named_by_readiness(cd, caplog, token, reason):
    caplog.set_level(logging.INFO, logger="faultmesh.agent")
    registry = CollectorRegistry()
    agent = AgentClient(
        f"127.0.0.1:{cd.grpc_port}", "node-a", "noded", token=token, registry=registry, backoff_max_s=0.5
    )
    assert agent.readiness() == "clusterd=down (connecting)"
    await agent.start()
    try:
        await _until(lambda: agent.metrics.token_refused._value.get() >= 3)
        refused = [r.getMessage() for r in caplog.records if r.name == "faultmesh.agent"]
        n = _series(registry, "faultmesh_agent_token_refused_total")
        assert n is not None and n >= 3
        # one line per refused attempt, each with the reason; no other stream line
        lines = [m for m in refused if m.startswith("clusterd refused the token ")]
        assert len(lines) == n  # read with no await between: the same attempts
        target = f"127.0.0.1:{cd.grpc_port}"
        said = f'target={target} token={"set" if token else "none"} detail="{reason}"'
        assert set(lines) == {f"clusterd refused the token {said}"}
        assert not [m for m in refused if not m.startswith("clusterd refused the token ")]
        assert agent.readiness() == f"clusterd=down (clusterd refused the token: {reason})"
        assert not agent.connected.is_set() and cd.nodes.get("node-a") is None
    finally:
        await agent.stop()


async def test_the_right_token_connects_and_readiness_says_up(cd):
    agent = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-a", "noded", token=TOKEN, backoff_max_s=0.5)
    await agent.start()
    try:
        await wait_for(agent.connected.wait(), 20.0)
        assert agent.readiness() == "clusterd=up"
        assert agent.metrics.token_refused._value.get() == 0
    finally:
        await agent.stop()


async def test_noded_readyz_and_metrics_say_the_token_was_refused(cd, tmp_path):
    (tmp_path / "wrong").write_text("not-the-token\n")
    args = config.parse(
        build_parser(()),
        ["--node-name", "node-a", "--clusterd", f"127.0.0.1:{cd.grpc_port}", "--http-addr", "127.0.0.1:0",
         "--clusterd-token-file", str(tmp_path / "wrong")],
    )  # fmt: skip
    nd = NodeD(args, ())
    await nd.start()
    try:
        await _until(lambda: nd.agent.metrics.token_refused._value.get() >= 1)
        base = f"http://127.0.0.1:{nd.http.port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/readyz") as r:
                ready = await r.text()
            async with s.get(f"{base}/metrics") as r:
                metrics = await r.text()
        assert ready.startswith("clusterd=down (clusterd refused the token: bearer token does not match)")
        assert "\nfaultmesh_agent_token_refused_total " in metrics
    finally:
        await nd.stop()


class _OlderClusterd(agent_pb2_grpc.AgentStreamServicer):
    """An agent stream endpoint that sends its response headers only with its first answer, as
    ClusterD did before issue 35: acks every message, the digest claim with DIGEST_MISMATCH."""

    async def Connect(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "delta":
                yield agent_pb2.ControlMessage(
                    ack=agent_pb2.Ack(seq=msg.delta.seq, digest=agent_pb2.DIGEST_MISMATCH)
                )
            elif msg.WhichOneof("body") == "snapshot":
                yield agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=msg.snapshot.seq))


async def test_an_older_clusterd_without_early_headers_is_served_after_the_accept_timeout():
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentStreamServicer_to_server(_OlderClusterd(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    agent = AgentClient(f"127.0.0.1:{port}", "node-a", "noded", accept_timeout_s=0.2, ack_timeout_s=10.0)
    await agent.start()
    try:
        await wait_for(agent.connected.wait(), 20.0)
        await agent.wait_synced(20.0)
        assert agent.readiness() == "clusterd=up"
    finally:
        await agent.stop()
        await server.stop(None)


async def test_deviced_readyz_says_the_token_was_refused(cd, tmp_path):
    (tmp_path / "wrong").write_text("not-the-token\n")
    args = deviced_parser().parse_args(
        ["--node-name", "node-d", "--backend", "sim", "--clusterd", f"127.0.0.1:{cd.grpc_port}",
         "--probe-interval", "0", "--http-addr", "127.0.0.1:0", "--clusterd-token-file", str(tmp_path / "wrong")]
    )  # fmt: skip
    dd = DeviceD(args, SimBackend(1, 2))
    await dd.start()
    try:
        await _until(lambda: dd.agent.metrics.token_refused._value.get() >= 1)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{dd.http.port}/readyz") as r:
                ready = await r.text()
        assert "clusterd=down (clusterd refused the token: bearer token does not match)" in ready
    finally:
        await dd.stop()
