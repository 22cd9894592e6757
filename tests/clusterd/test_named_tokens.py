"""Named tokens (issue 31): clusterd's --token-file may hold ``name:token`` lines, so an operator
action records the VERIFIED token's name beside the ``--by`` the caller claims; the plain one-token
file keeps working (its token is named ``default``), and the agents keep sending the one token
they share (every named token is accepted where a token is needed)."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest
from prometheus_client import CollectorRegistry
from support import make_clusterd, public_request

from clusterd.auth import TokenAuth, parse_tokens
from faultmesh._pb import pubfault_pb2_grpc
from faultmesh.config import BadSecretFile
from faultmesh.httplite import rejected_counter
from faultmesh.model import Fault
from fmtools.cli import main as cli_main

AGENTS, ALICE, BOB = "agent-shared-t0ken", "alice-t0ken", "bob-t0ken"
TOKENS = f"# who may write to clusterd\nagents:{AGENTS}\nops-alice:{ALICE}\n\nops-bob: {BOB}\n"


def test_the_file_formats():
    assert parse_tokens("s3cret:with:colons\n") == {"default": "s3cret:with:colons"}  # one line: plain
    assert parse_tokens(TOKENS) == {"agents": AGENTS, "ops-alice": ALICE, "ops-bob": BOB}
    for text, why in (
        ("a:SECRET1\njust-a-SECRET\n", "line 2: expected name:token"),
        ("a:SECRET1\nb c:SECRET2\n", "line 2: expected name:token"),
        ("a:SECRET1\na:SECRET2\n", "line 2: the name or the token of 'a' is given twice"),
        ("a:SECRET1\nb:SECRET1\n", "line 2: the name or the token of 'b' is given twice"),
        ("# nothing\n\n", "holds no token"),
    ):
        with pytest.raises(BadSecretFile, match=why) as e:
            parse_tokens(text, "--token-file t")
        assert "SECRET" not in str(e.value)  # the error names the line, never the token


def test_each_token_is_accepted_and_named():
    auth = TokenAuth(parse_tokens(TOKENS), rejected_counter(CollectorRegistry()))
    assert auth.names == ["agents", "ops-alice", "ops-bob"]
    assert auth.token_name(f"Bearer {BOB}") == "ops-bob" and auth.check(f"Bearer {AGENTS}")
    assert auth.token_name("Bearer nope") is None and not auth.check("Bearer nope") and not auth.check(None)
    assert auth.check_metadata([("authorization", f"Bearer {ALICE}")])
    assert auth.token_name("Bearer ünïcode") is None  # not ASCII: refused, never a TypeError
    plain = TokenAuth("s3cret", rejected_counter(CollectorRegistry()))
    assert plain.token_name("Bearer s3cret") == "default"


async def test_an_acknowledgement_records_the_verified_token(tmp_path, capsys):
    (tmp_path / "tokens").write_text(TOKENS)
    (tmp_path / "bob").write_text(BOB + "\n")  # what ops-bob's CLI reads: his token alone
    cd = await make_clusterd(tmp_path, "--token-file", str(tmp_path / "tokens"))
    try:
        await cd.center.upsert(Fault("dcmi", "node-1", "NPU", 2, "80E18008", "RestartNPU"), origin="deviced")
        http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "bob")]
        argv = ["ack", "node-1", "80E18008", "--for", "1h", "--by", "alice", "--reason", "HBM swap booked"]
        assert await asyncio.to_thread(cli_main, [*argv, *http]) == 0
        capsys.readouterr()
        assert await asyncio.to_thread(cli_main, ["history", "--node", "node-1", *http]) == 0
        out = capsys.readouterr().out  # claims alice, holds ops-bob's token: both are shown
        assert "acknowledged by alice (token ops-bob) until" in out and "HBM swap booked" in out, out
        assert await asyncio.to_thread(cli_main, ["faults", "--node", "node-1", *http]) == 0
        [row] = capsys.readouterr().out.splitlines()[1:]
        assert "alice (token ops-bob) until" in row, row  # the ACKNOWLEDGED column
        async with aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{cd.http.port}"
            async with s.get(f"{base}/v1/acks") as r:
                [ack] = await r.json()
            assert (ack["by"], ack["token"], ack["auth"]) == ("alice", "ops-bob", "token")
            body = {"reason": "checked"}
            async with s.post(
                f"{base}/v1/release/breaker", json=body, headers={"Authorization": "Bearer x"}
            ) as r:
                assert r.status == 401  # a token not in the file
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:  # the agents' token
            stub = pubfault_pb2_grpc.PubFaultStub(ch)
            r = await stub.SendPublicFault(
                public_request("named-1"), metadata=(("authorization", f"Bearer {AGENTS}"),), timeout=10
            )
            assert r.info  # answered by PubFault itself (its own code), not refused
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.SendPublicFault(
                    public_request("named-2"), metadata=(("authorization", "Bearer x"),), timeout=10
                )
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await cd.stop()
