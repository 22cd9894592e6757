"""deviced's HTTP port needs the agent's token for every mutating request when one is configured
(issue 19 #7): a token-less or wrong-token POST gets 401 and changes nothing (here the sim control
API, mounted on deviced's port as ``main`` does without ``--sim-control-addr``); with the token it
is served; reads (``/v1/devices``, ``/metrics``) stay open for Prometheus and the kubelet."""

from __future__ import annotations

import asyncio

import aiohttp
from support import free_port, until

from deviced import simapi
from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend
from fmtools.cli import main


async def test_mutating_requests_need_the_token_when_one_is_configured(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}",
         "--probe-interval", "0", "--http-addr", "127.0.0.1:0",
         "--clusterd-token-file", str(tmp_path / "token")]
    )  # fmt: skip
    app = DeviceD(args, sim)
    simapi.add_routes(app.http.app, sim)
    await app.start()
    base = f"http://127.0.0.1:{app.http.port}"
    body = {"device": 1, "code": "80E18008", "assertion": "occur"}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/sim/fault", json=body) as r:
                assert r.status == 401 and (await r.json()) == {"error": "bearer token required"}
            async with s.post(f"{base}/sim/fault", json=body, headers={"Authorization": "Bearer bad"}) as r:
                assert r.status == 401 and (await r.json()) == {"error": "bearer token does not match"}
            async with s.post(f"{base}/v1/devices/1/release") as r:
                assert r.status == 401
            assert sim.devs[1].codes == []  # nothing injected
            async with s.post(
                f"{base}/sim/fault", json=body, headers={"Authorization": "Bearer s3cret"}
            ) as r:
                assert r.status == 200
            assert sim.devs[1].codes == [0x80E18008]
            wide = {**body, "code": "FFFFFFFFFF"}  # no DCMI event id: refused, nothing injected (tryout)
            async with s.post(
                f"{base}/sim/fault", json=wide, headers={"Authorization": "Bearer s3cret"}
            ) as r:
                assert r.status == 400 and "does not fit 32 bits" in (await r.json())["error"]
            assert sim.devs[1].codes == [0x80E18008]
            await until(  # settled before the stop
                lambda: (d := app.state.devices.get(("NPU", 1))) is not None and d.health == "UnHealthy"
            )
            for path in ("/v1/devices", "/metrics", "/healthz", "/sim/devices"):
                async with s.get(base + path) as r:
                    assert r.status == 200, path
            async with s.get(f"{base}/metrics") as r:
                text = await r.text()
        assert 'faultmesh_rejected_requests_total{reason="unauthenticated",service="http"} 3.0' in text
        cli = ["device-sim", "--sim", f"127.0.0.1:{app.http.port}", "fault", "0", "80E18008"]
        assert await asyncio.to_thread(main, cli) != 0  # the CLI without the token is refused
        assert sim.devs[0].codes == []
        assert (
            await asyncio.to_thread(main, [*cli[:3], "--token-file", str(tmp_path / "token"), *cli[3:]]) == 0
        )
        assert sim.devs[0].codes == [0x80E18008]
        await until(lambda: (d := app.state.devices.get(("NPU", 0))) is not None and d.health == "UnHealthy")
    finally:
        await app.stop()


async def test_without_a_token_the_port_stays_open(tmp_path):
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
            body = {"device": 1, "code": "80E18008", "assertion": "occur"}
            async with s.post(f"http://127.0.0.1:{app.http.port}/sim/fault", json=body) as r:
                assert r.status == 200
    finally:
        await app.stop()
