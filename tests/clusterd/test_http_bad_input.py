"""ClusterD's HTTP API under hostile bodies: a 4xx with a reason, never a 500, and it keeps serving."""

from __future__ import annotations

import aiohttp
import pytest

DEEP = b"[" * 100_000 + b"]" * 100_000
BAD_UTF8 = b'\xff\xfe{"id":1}'


@pytest.mark.parametrize(
    "path", ["/v1/jobs", "/v1/pingmesh/topology", "/v1/pingmesh/config", "/v1/slownode/jobs"]
)
@pytest.mark.parametrize("body", [DEEP, BAD_UTF8, b"{not json", b"\x00" * 1000])
async def test_bad_bodies_get_400(cd, path, body):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{cd.http.port}{path}", data=body) as r:
            assert 400 <= r.status < 500, (path, r.status, await r.text())
            assert "error" in await r.json()
        async with s.get(f"http://127.0.0.1:{cd.http.port}/healthz") as r:
            assert r.status == 200


async def test_an_unknown_level_filter_is_400_not_an_empty_list(cd):
    # the CLI refuses 'faults --level Bogus'; the HTTP API answered [] (tryout)
    async with aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{cd.http.port}/v1/faults"
        async with s.get(base, params={"level": "Bogus"}) as r:
            assert r.status == 400 and "unknown fault level 'Bogus'" in (await r.json())["error"]
        async with s.get(base, params={"level": "RestartNPU"}) as r:
            assert r.status == 200 and await r.json() == []
