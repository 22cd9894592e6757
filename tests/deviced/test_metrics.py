"""The /metrics deviced exposes (issue 4 "Ops"), on the sim backend."""

from __future__ import annotations

import aiohttp
from support import free_port, until

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


async def test_metrics_exposed():
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "node-m", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}",
         "--probe-interval", "0.2"]
    )  # fmt: skip
    app = DeviceD(args, sim)
    await app.start()
    try:
        await until(lambda: app.cycles >= 1)
        sim.inject(0, 0x80E18008, 1)
        sim.inject(0, 0xDEAD0001, 1, severity=0)
        await until(lambda: app.state.devices[("NPU", 0)].health == "UnHealthy")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{app.http.port}/metrics") as r:
            text = await r.text()
    finally:
        await app.stop()
    assert 'faultmesh_deviced_events_total{level="RestartNPU",source="callback"} 1.0' in text
    assert 'faultmesh_deviced_event_outcomes_total{outcome="unknown_code"} 1.0' in text
    assert 'faultmesh_deviced_device_healthy{device="0",node="node-m"} 0.0' in text
    assert 'faultmesh_deviced_device_healthy{device="1",node="node-m"} 1.0' in text
    assert 'faultmesh_deviced_device_network_healthy{device="0",node="node-m"} 1.0' in text
    assert "faultmesh_deviced_poll_duration_seconds_count" in text
    assert 'faultmesh_deviced_callback_drops_total{kind="chip"} 0.0' in text
    assert "faultmesh_deviced_subscribed 1.0" in text
