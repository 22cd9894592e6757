"""The agents' aiohttp-free HTTP server (faultmesh.httplite, issue 18) answers as the aiohttp one
did: token before routing, 404 / 405, HEAD, 413, junk counted as malformed, keep-alive, and a
stop that closes idle connections."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from faultmesh.httplite import HttpServer, json_response, parse_addr


@pytest.fixture
async def server():
    reg = CollectorRegistry()
    s = HttpServer("127.0.0.1:0", reg, token="tok", client_max_size=1024)

    async def echo(request):
        body = await request.json() if request.method == "POST" else None
        return json_response({"body": body, "q": request.query.get("q")})

    async def broken(request):
        raise RuntimeError("boom")

    s.app.router.add_get("/v1/x", echo)
    s.app.router.add_post("/v1/p", echo)
    s.app.router.add_get("/v1/broken", broken)
    await s.start()
    yield s, reg, f"http://127.0.0.1:{s.port}"
    await s.stop()


def rejected(reg: CollectorRegistry, reason: str) -> float:
    return (
        reg.get_sample_value("faultmesh_rejected_requests_total", {"service": "http", "reason": reason}) or 0
    )


async def test_routes_token_and_errors_answer_as_before(server):
    s, reg, url = server
    auth = {"Authorization": "Bearer tok"}
    async with aiohttp.ClientSession() as c:
        async with c.get(url + "/v1/x?q=1&q=2") as r:
            assert r.status == 200 and r.content_type == "application/json"
            assert await r.read() == b'{"body":null,"q":"1"}'
        async with c.head(url + "/v1/x") as r:
            assert r.status == 200 and await r.read() == b""
        async with c.get(url + "/healthz") as r:
            assert (r.status, await r.text(), r.charset) == (200, "ok\n", "utf-8")
        async with c.get(url + "/metrics") as r:
            assert r.status == 200 and "faultmesh_rejected_requests_total" in await r.text()
        async with c.post(url + "/v1/nope") as r:  # the token is checked before routing
            assert r.status == 401 and await r.json() == {"error": "bearer token required"}
        async with c.post(url + "/v1/x", headers={"Authorization": "Bearer nope"}) as r:
            assert r.status == 401 and await r.json() == {"error": "bearer token does not match"}
        assert rejected(reg, "unauthenticated") == 2
        async with c.post(url + "/v1/x", headers=auth) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"
        async with c.get(url + "/v1/nope") as r:
            assert (r.status, await r.text()) == (404, "404: Not Found")
        async with c.post(url + "/v1/p", headers=auth, json={"a": [1]}) as r:
            assert r.status == 200 and (await r.json())["body"] == {"a": [1]}
        async with c.post(url + "/v1/p", headers=auth, data=b"x" * 2048) as r:
            assert r.status == 413
        async with c.get(url + "/v1/broken") as r:
            assert r.status == 500


async def test_junk_is_a_counted_400_and_keep_alive_serves_several_requests(server):
    s, reg, url = server
    r, w = await asyncio.open_connection("127.0.0.1", s.port)
    w.write(b"\x16\x03\x01 not http\r\n\r\n")
    await w.drain()
    assert (await r.read()).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    w.close()
    assert rejected(reg, "malformed") == 1
    r, w = await asyncio.open_connection("127.0.0.1", s.port)
    for _ in range(2):  # one connection, two requests
        w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and await r.readexactly(3) == b"ok\n"
    await s.stop()  # the idle keep-alive connection is closed, its task ends
    assert await r.read() == b""
    w.close()


def test_parse_addr_refuses_a_port_out_of_range_naming_the_address():
    """tryout: 127.0.0.1:99999 was taken as port 99999 and failed (or wrapped) only at bind time."""
    assert parse_addr("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_addr("[::1]:65535") == ("::1", 65535)
    assert parse_addr(":0") == ("127.0.0.1", 0)  # any free port, as the tests listen
    for addr, words in (
        ("127.0.0.1:65536", "Port out of range 0-65535: 65536"),
        ("127.0.0.1:-1", "Port out of range 0-65535: -1"),
        ("127.0.0.1:http", "port 'http' is not a number"),
        ("127.0.0.1:", "port '' is not a number"),
    ):
        with pytest.raises(ValueError) as e:
            parse_addr(addr)
        assert str(e.value) == f"bad address {addr!r}: {words}"
    with pytest.raises(ValueError, match="Port out of range"):
        HttpServer("127.0.0.1:99999", CollectorRegistry())
