"""Table reload (reference deviced.md §1.1 fault-config polling, §4.2 re-applying the config), on the sim backend."""

from __future__ import annotations

import asyncio
import json

from support import free_port, until

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


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


async def test_fault_config_configmap_overrides_without_an_api_server(tmp_path):
    """The mindx-dl-fault-config consumer alone (deviced.faultconfig; the emulator test is in
    tests/kube): a key overrides its file, bad keys are counted, a deleted map gives the file back."""
    from deviced.faultconfig import FaultConfigMap

    codes = tmp_path / "faultCode.json"
    codes.write_text(json.dumps({"RestartBusinessCodes": ["80E18005"]}))
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}", "--probe-interval", "0",
         "--fault-code-file", str(codes)]
    )  # fmt: skip
    app = DeviceD(args, SimBackend(1, 1))
    cm = FaultConfigMap(app.reloader, "configmap kube-system/mindx-dl-fault-config")
    table = json.dumps({"SeparateNPUCodes": ["80E18005"]})
    assert cm.on_configmap({"data": {"faultCode.json": table}}) == ["faultCode.json"]
    assert app.engine.table.listed_level(0x80E18005).name == "SeparateNPU"
    assert cm.on_configmap({"data": {"faultCode.json": table}}) == []  # unchanged: nothing re-applied
    assert (
        cm.on_configmap({"data": {"faultCode.json": table[:-2], "x.json": "{}", "PollInterval": "x"}}) == []
    )
    assert cm.on_configmap({"data": ["not", "an", "object"]}) == ["faultCode.json"]  # no usable key: the file
    assert dict(app.reloader.failures) == {"faultCode.json": 1, "unknown-key": 2, "PollInterval": 1}
    assert app.engine.table.listed_level(0x80E18005).name == "RestartBusiness"
    assert cm.on_configmap({"data": {"faultCode.json": table}}) == ["faultCode.json"]
    assert cm.on_configmap(None) == ["faultCode.json"] and app.reloader.overrides == {}
    assert app.engine.table.listed_level(0x80E18005).name == "RestartBusiness"
    app.io.shutdown()
