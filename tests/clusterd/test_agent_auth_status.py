"""An agent stream refused for its token is told UNAUTHENTICATED with the reason, every time (issue 35).

Measured before: clusterd with ``--token-file`` and mTLS refused every such stream, but the client
saw INTERNAL "Internal error from Core" in 10-35 % of the tries: the refusal (a trailers-only answer)
closed the stream while the agent's Hello was being written, and grpcio's client then reports its
failed write instead of the server's status. Now ClusterD sends the response headers of an accepted
stream at once and the agent writes nothing before they come (:func:`faultmesh.agent.open_stream`),
so the status of a refusal is the one it reads. Each variant is opened 50 times, each on a channel
of its own (as each agent session is), and every answer is checked.
"""

from __future__ import annotations

import grpc
import pytest
from noded_support import make_pki
from support import make_clusterd

from faultmesh._pb import agent_pb2
from faultmesh.agent import open_stream
from faultmesh.runtime import wait_for

TOKEN = "s3cret"
TRIES = 50
REFUSED = {
    "none": (None, "bearer token required"),
    "bad scheme": ((("authorization", f"Basic {TOKEN}"),), "bearer token does not match"),
    "lowercase scheme": ((("authorization", f"bearer {TOKEN}"),), "bearer token does not match"),
    "wrong token": ((("authorization", "Bearer nope"),), "bearer token does not match"),
}
RIGHT = (("authorization", f"Bearer {TOKEN}"),)
OPTS = (("grpc.ssl_target_name_override", "localhost"),)


@pytest.fixture
async def mtls(tmp_path):
    """A clusterd with mTLS and a token; yields (clusterd, client credentials)."""
    ca, files = make_pki(tmp_path)
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    cd = await make_clusterd(
        tmp_path,
        *("--tls-cert", str(files["server"][0]), "--tls-key", str(files["server"][1])),
        *("--tls-ca", str(ca), "--token-file", str(tmp_path / "token")),
    )
    creds = grpc.ssl_channel_credentials(
        ca.read_bytes(), files["client"][1].read_bytes(), files["client"][0].read_bytes()
    )
    yield cd, creds
    await cd.stop()


async def _session(channel, metadata) -> tuple[str, str]:
    """One agent session's opening: accepted, then Hello and the digest claim back to back, as
    AgentClient writes them; the status it ends with (``OK`` when ClusterD answered the claim)."""
    try:
        call = await open_stream(channel, metadata, accept_timeout_s=10.0)
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-a", agent="noded")))
        await call.write(agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=1, snapshot_digest=b"\0" * 32)))
        msg = await wait_for(call.read(), 10.0)
        call.cancel()
        return "OK", msg.WhichOneof("body")
    except grpc.aio.AioRpcError as e:
        return e.code().name, e.details()


@pytest.mark.parametrize("variant", list(REFUSED))
async def test_a_refused_agent_stream_is_told_unauthenticated_every_time(mtls, variant):
    cd, creds = mtls
    metadata, reason = REFUSED[variant]
    answers = []
    for _ in range(TRIES):
        async with grpc.aio.secure_channel(f"127.0.0.1:{cd.grpc_port}", creds, options=OPTS) as ch:
            answers.append(await _session(ch, metadata))
    assert answers == [("UNAUTHENTICATED", reason)] * TRIES
    assert cd.rejected.labels("agent", "unauthenticated")._value.get() == TRIES
    assert cd.agents.connected() == [] and cd.nodes.get("node-a") is None


async def test_the_right_token_in_plaintext_never_reaches_a_tls_clusterd(mtls):
    """The right token on a plaintext channel: the TLS handshake fails, so no gRPC status of
    ClusterD's can reach it; the client is told UNAVAILABLE, every time, and nothing is stored."""
    cd, _ = mtls
    codes = []
    for _ in range(TRIES):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            codes.append((await _session(ch, RIGHT))[0])
    assert codes == ["UNAVAILABLE"] * TRIES
    assert cd.agents.connected() == [] and cd.nodes.get("node-a") is None


async def test_an_accepted_stream_gets_its_headers_before_the_agent_writes(mtls):
    """What makes the refusal unambiguous: an accepted stream is answered with its response headers
    before anything was written (a refused one gets a trailers-only answer instead); with them the
    session goes on as ever (the claim is answered)."""
    cd, creds = mtls
    async with grpc.aio.secure_channel(f"127.0.0.1:{cd.grpc_port}", creds, options=OPTS) as ch:
        call = ch.stream_stream("/faultmesh.v1.AgentStream/Connect")(metadata=RIGHT)
        await wait_for(call.initial_metadata(), 10.0)
        assert not call.done()
        call.cancel()
        assert await _session(ch, RIGHT) == ("OK", "ack")
    assert cd.rejected.labels("agent", "unauthenticated")._value.get() == 0
