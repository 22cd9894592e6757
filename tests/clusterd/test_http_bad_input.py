"""ClusterD's HTTP API under hostile bodies: a 4xx with a reason, never a 500, and it keeps serving."""

from __future__ import annotations

import aiohttp
import pytest

DEEP = b"[" * 100_000 + b"]" * 100_000
BAD_UTF8 = b'\xff\xfe{"id":1}'


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs",
        "/v1/pingmesh/topology",
        "/v1/pingmesh/config",
        "/v1/slownode/jobs",
        "/v1/release/npu",
        "/v1/release/node",
    ],
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


async def test_large_yaml_bodies_are_refused_at_once_and_json_of_that_size_is_read(cd):
    # tryout: 16 MiB YAML job bodies held clusterd for minutes at 4+ GiB RSS (PyYAML builds a node
    # per scalar). Over 1 MiB, YAML is refused before parsing; the same size as JSON is parsed.
    import asyncio
    import time

    big_yaml = b"- {name: job-x, namespace: default, ranks: [" + b",".join([b"1"] * 700_000) + b"]}\n"
    assert len(big_yaml) > 1 << 20
    async with aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{cd.http.port}"

        async def post(path, body):
            async with s.post(base + path, data=body) as r:
                return r.status, await r.json()

        t0 = time.monotonic()
        got = await asyncio.gather(
            *(post(p, big_yaml) for p in ["/v1/jobs"] * 4 + ["/v1/pingmesh/config"] * 2)
        )
        assert time.monotonic() - t0 < 10  # refused, not parsed
        for status, body in got:
            assert (
                status == 400 and "the limit is 1048576 bytes for YAML; send it as JSON" in body["error"]
            ), body
        big_json = (
            b'{"name": "job-x", "namespace": "default", "ranks": [' + b",".join([b"1"] * 700_000) + b"]}"
        )
        status, body = await post("/v1/jobs", big_json)
        assert status == 400 and body["error"].startswith("job 0: "), body  # read and judged as a job
        async with s.get(base + "/healthz") as r:
            assert r.status == 200
