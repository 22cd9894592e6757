"""The sim backend's control API answers 400 to a body that is not a JSON object, never 500: 100k
nested ``[`` (the stdlib decoder's RecursionError answered 500 on clusterd's release endpoints, found
by the new-user tryout), bad UTF-8, truncated JSON, NUL bytes. The agents' HTTP server decodes with
orjson (depth limit 1024, a ``ValueError``); this keeps it that way."""

from __future__ import annotations

import aiohttp
import pytest
from support import free_port

from deviced import simapi
from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("body", [DEEP, b'\xff\xfe{"device":1}', b"{not json", b"\x00" * 1000, b"[1]"])
async def test_bad_sim_bodies_get_400(body):
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}",
         "--probe-interval", "0", "--http-addr", "127.0.0.1:0"]
    )  # fmt: skip
    app = DeviceD(args, sim)
    simapi.add_routes(app.http.app, sim)
    await app.start()
    try:
        async with aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{app.http.port}"
            for path in ("/sim/fault", "/sim/link", "/sim/switch"):
                async with s.post(base + path, data=body) as r:
                    assert r.status == 400, (path, r.status, await r.text())
                    assert "error" in await r.json()
            async with s.get(base + "/healthz") as r:
                assert r.status == 200
    finally:
        await app.stop()
