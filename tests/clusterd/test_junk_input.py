"""Junk input is refused cleanly, counted, and logged once per interval (issue 19 #9).

Undecodable protobuf gets INVALID_ARGUMENT (grpcio's own answer is UNKNOWN "Unexpected DecodeError"
with an ERROR traceback per call) on unary, server-streaming and bidirectional methods; a request
aiohttp cannot parse gets 400. Both are counted in ``faultmesh_rejected_requests_total`` and logged
once per minute with the count; no traceback reaches the log.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from support import until

JUNK = b"\xff\xff\xff\xff"  # a field number 0 / truncated varint: never a valid message

METHODS = [
    ("/PubFault/SendPublicFault", "unary_unary", "pubfault"),  # labelled as the token check labels
    ("/job.Job/Register", "unary_unary", "brain"),
    ("/job.Job/SubscribeJobSummarySignal", "unary_stream", "brain"),
    ("/fault.Fault/GetFaultMsgSignal", "unary_unary", "fault.Fault"),  # open: its service's name
    ("/faultmesh.v1.AgentStream/Connect", "stream_stream", "agent"),
]


def rejected(cd, service: str, reason: str) -> float:
    return (
        cd.registry.get_sample_value(
            "faultmesh_rejected_requests_total", {"service": service, "reason": reason}
        )
        or 0.0
    )


async def call_junk(port: int, method: str, kind: str) -> grpc.StatusCode:
    ident = {"request_serializer": None, "response_deserializer": None}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            if kind == "unary_unary":
                await ch.unary_unary(method, **ident)(JUNK, timeout=5)
            elif kind == "unary_stream":
                async for _ in ch.unary_stream(method, **ident)(JUNK, timeout=5):
                    pass
            else:
                call = ch.stream_stream(method, **ident)(timeout=5)
                await call.write(JUNK)
                async for _ in call:
                    pass
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(("method", "kind", "service"), METHODS)
async def test_undecodable_protobuf_is_invalid_argument_counted_and_logged_once(
    cd, caplog, method, kind, service
):
    caplog.set_level(logging.DEBUG)
    for _ in range(20):
        assert await call_junk(cd.grpc_port, method, kind) == grpc.StatusCode.INVALID_ARGUMENT
    assert rejected(cd, service, "undecodable") == 20
    said = [r for r in caplog.records if "request undecodable" in r.getMessage()]
    assert len(said) == 1  # once per interval; the other 19 are counted
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def raw_http(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_malformed_http_gets_400_counted_and_no_traceback(cd, caplog):
    caplog.set_level(logging.DEBUG)
    junk = [
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 20000 + b"\r\n\r\n",
        b"GET /\x00 HTTP/1.1\r\n\r\n",
    ] * 4
    for data in junk:
        assert (await raw_http(cd.http.port, data)).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    assert rejected(cd, "http", "malformed") == len(junk)
    said = [r for r in caplog.records if "http request malformed" in r.getMessage()]
    assert len(said) == 1
    assert not [r for r in caplog.records if r.exc_info]
    ok = await raw_http(cd.http.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200")  # the server is fine


async def test_a_client_gone_mid_body_is_counted_without_a_traceback(cd, caplog):
    """Closing the connection during a POST body logged aiohttp's ERROR traceback (tryout finding)."""
    caplog.set_level(logging.DEBUG)
    r, w = await asyncio.open_connection("127.0.0.1", cd.http.port)
    w.write(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"{" * 100)
    await w.drain()
    w.close()  # 99,900 bytes short
    await w.wait_closed()
    assert await until(lambda: rejected(cd, "http", "client_gone") == 1)
    assert [r.getMessage() for r in caplog.records if "http client went away" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info]
