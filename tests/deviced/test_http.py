"""deviced's HTTP API: GET /v1/devices (read only: the unauthenticated port releases nothing) and
the operator release of a ManuallySeparateNPU chip (§4.2), which comes from clusterd as a
``release`` control message."""

from __future__ import annotations

import asyncio

import aiohttp
from support import free_port, until

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend
from faultmesh._pb import agent_pb2


def _deviced() -> tuple[DeviceD, SimBackend]:
    """deviced on a simulated 2-chip card, its clusterd address a free port (never connected)."""
    sim = SimBackend(1, 2)
    argv = ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}"]
    return DeviceD(build_parser().parse_args([*argv, "--probe-interval", "0"]), sim), sim


async def _separate(app: DeviceD, sim: SimBackend) -> None:
    """80E18008 twice in 24 h on chip 1 -> deviced's own ManuallySeparateNPU (frequency rule)."""
    for _ in range(2):
        sim.inject(1, 0x80E18008, 1)
        await until(lambda: app.state.devices[("NPU", 1)].health == "UnHealthy")
        sim.inject(1, 0x80E18008, 0)
        await asyncio.sleep(1.2)
    await until(lambda: app.state.devices[("NPU", 1)].level == "ManuallySeparateNPU")


async def test_devices_endpoint_and_operator_release():
    app, sim = _deviced()
    await app.start()
    base = f"http://127.0.0.1:{app.http.port}"
    try:
        await until(lambda: app.cycles >= 1)
        await _separate(app, sim)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/v1/devices") as r:
                body = await r.json()
            d1 = body["devices"][1]
            assert d1["manually_separated"] and d1["level"] == "ManuallySeparateNPU"
            assert d1["upgrades"][0]["type"] == "FaultFrequency" and d1["upgrades"][0]["code"] == "80E18008"
            async with s.post(f"{base}/v1/devices/1/release") as r:
                assert r.status in (404, 405)  # no release on the agent's own port
        assert app.state.devices[("NPU", 1)].level == "ManuallySeparateNPU"
        await app.on_control(agent_pb2.ControlMessage(release=agent_pb2.ReleaseDevice(phy_id=9)))  # unknown
        await app.on_control(agent_pb2.ControlMessage(release=agent_pb2.ReleaseDevice(phy_id=1)))
        assert app.state.devices[("NPU", 1)].level == ""
        assert app.state.devices[("NPU", 1)].health == "Healthy"
    finally:
        await app.stop()


async def test_a_release_delivered_again_spares_a_separation_raised_since():
    """ClusterD re-sends a control message whose ack was lost (clusterd/ingest/control.py): a
    release applied, then the chip separated again, then the same release delivered once more must
    leave the new separation alone -- the message carries what the operator saw
    (``seen_until_ms``); a release without it (an older ClusterD) drops every one."""
    app, sim = _deviced()
    await app.start()
    try:
        await until(lambda: app.cycles >= 1)
        await _separate(app, sim)
        await until(lambda: any(f.level == "ManuallySeparateNPU" for f in app.state.faults.values()))
        [held] = [
            f for f in app.state.faults.values() if f.device_id == 1 and f.level == "ManuallySeparateNPU"
        ]
        release = agent_pb2.ControlMessage(
            release=agent_pb2.ReleaseDevice(phy_id=1, seen_until_ms=held.last_seen_ms)
        )
        await app.on_control(release)
        assert app.state.devices[("NPU", 1)].level == ""
        await asyncio.sleep(0.05)  # the next escalation's time is after what the operator saw
        await _separate(app, sim)
        await app.on_control(release)  # the same message again (its ack was lost)
        assert app.state.devices[("NPU", 1)].level == "ManuallySeparateNPU"
        await app.on_control(agent_pb2.ControlMessage(release=agent_pb2.ReleaseDevice(phy_id=1)))
        assert app.state.devices[("NPU", 1)].level == ""
    finally:
        await app.stop()
