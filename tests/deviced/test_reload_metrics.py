"""Table reload (reference deviced.md §1.1 fault-config polling, §4.2 re-applying the config) and the
/metrics deviced exposes (issue 4 "Ops"), on the sim backend."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


async def until(pred, timeout_s=8.0):
    for _ in range(int(timeout_s / 0.05)):
        if pred():
            return True
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def test_changed_table_files_are_reloaded_and_escalations_relevelled(tmp_path):
    codes = tmp_path / "faultCode.json"
    custom = tmp_path / "faultCustomization.json"
    codes.write_text(json.dumps({"RestartBusinessCodes": ["80E18005"]}))
    rule = {"EventId": ["80E18005"], "TimeWindow": 3600, "Times": 2, "FaultHandling": "ManuallySeparateNPU"}
    custom.write_text(json.dumps({"FaultFrequency": [rule]}))
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}", "--probe-interval", "0",
         "--fault-code-file", str(codes), "--fault-customization-file", str(custom),
         "--table-reload-interval", "0.1", "--list-watch-period", "3"]
    )  # fmt: skip
    app = DeviceD(args, sim)
    await app.start()
    try:
        await until(lambda: app.cycles >= 1)
        sim.inject(1, 0x80E18005, 1)
        await until(lambda: app.state.devices[("NPU", 1)].level == "RestartBusiness")
        sim.inject(1, 0x80E18005, 0)
        await asyncio.sleep(1.3)
        sim.inject(1, 0x80E18005, 1)
        await until(lambda: app.state.devices[("NPU", 1)].level == "ManuallySeparateNPU")
        # the operator changes both files: the code is now RestartNPU, the rule now SeparateNPU
        codes.write_text(json.dumps({"RestartNPUCodes": ["80E18005"]}))
        custom.write_text(
            json.dumps(
                {"FaultFrequency": [{**rule, "FaultHandling": "SeparateNPU", "ReleaseTimeWindow": 600}]}
            )
        )
        await until(lambda: app.state.devices[("NPU", 1)].level == "SeparateNPU")
        # a broken file keeps the tables in force
        codes.write_text("{not json")
        await asyncio.sleep(0.5)
        assert app.engine.table.listed_level(0x80E18005).name == "RestartNPU"
        # the rule is removed: its escalation goes
        custom.write_text("{}")
        await until(lambda: app.state.devices[("NPU", 1)].level == "RestartNPU")
    finally:
        await app.stop()


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


async def test_switch_event_burst_is_bounded_and_resynced():
    from deviced.app import SWITCH_QUEUE_MAX
    from faultmesh.dcmi.lingqu import SwitchEvent

    sim = SimBackend(1, 1)
    args = build_parser().parse_args(
        [
            "--node-name",
            "n",
            "--backend",
            "sim",
            "--clusterd",
            f"127.0.0.1:{free_port()}",
            "--probe-interval",
            "0",
        ]
    )
    app = DeviceD(args, sim)
    await app.init_backend()
    try:
        sim.switch.faults = [SwitchEvent(0x00F1FEF5, 155914, 1, 0, 2, 7, 2, 1, 1, 0, 0)]
        for i in range(SWITCH_QUEUE_MAX + 500):  # a burst from the lingqu thread
            app.lingqu.on_event(SwitchEvent(0x12345678, i, 1, 0, 0, 0, 2, 1, i, 0, 0))
        assert len(app.lingqu.queue) == SWITCH_QUEUE_MAX and app.switch_drops == 500
        await app.run_cycle()
        assert app.lingqu.queue == [] and not app.lingqu.resync_pending
        # the full query replaced the partial burst: the state is the library's current list
        assert [f.code for f in app.state.faults.values() if f.source == "lingqu"] == [
            "[0x00f1fef5,155914,npu,na]"
        ]
    finally:
        app.blocking.shutdown()
        app.probe_pool.shutdown()


async def test_devices_endpoint_and_operator_release():
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        [
            "--node-name",
            "n",
            "--backend",
            "sim",
            "--clusterd",
            f"127.0.0.1:{free_port()}",
            "--probe-interval",
            "0",
        ]
    )
    app = DeviceD(args, sim)
    await app.start()
    base = f"http://127.0.0.1:{app.http.port}"
    try:
        await until(lambda: app.cycles >= 1)
        for _ in range(2):  # 80E18008 twice in 24 h -> ManuallySeparateNPU
            sim.inject(1, 0x80E18008, 1)
            await until(lambda: app.state.devices[("NPU", 1)].health == "UnHealthy")
            sim.inject(1, 0x80E18008, 0)
            await asyncio.sleep(1.2)
        await until(lambda: app.state.devices[("NPU", 1)].level == "ManuallySeparateNPU")
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/v1/devices") as r:
                body = await r.json()
            d1 = body["devices"][1]
            assert d1["manually_separated"] and d1["level"] == "ManuallySeparateNPU"
            assert d1["upgrades"][0]["type"] == "FaultFrequency" and d1["upgrades"][0]["code"] == "80E18008"
            async with s.post(f"{base}/v1/devices/9/release") as r:
                assert r.status == 404
            async with s.post(f"{base}/v1/devices/x/release") as r:
                assert r.status == 400
            async with s.post(f"{base}/v1/devices/1/release") as r:
                assert (await r.json()) == {"phy_id": 1, "released": True}
        assert app.state.devices[("NPU", 1)].level == ""
        assert app.state.devices[("NPU", 1)].health == "Healthy"
    finally:
        await app.stop()
