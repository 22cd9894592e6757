"""The reference's fault-table ConfigMaps, followed live by the agents on the Kubernetes emulator
(issue 13): deviced's ``mindx-dl-fault-config`` (reference deviced.md §1.1, §9) and noded's
``mindx-dl-node-fault-config`` (noded.md §2). An override changes a level without a restart (the
level reaches clusterd); a bad ConfigMap keeps the last good table and is counted."""

from __future__ import annotations

import asyncio
import json

from support import eventually, free_port

from deviced.app import DeviceD
from deviced.app import build_parser as deviced_parser
from deviced.backends import SimBackend
from deviced.tables import Customization
from faultmesh import config
from faultmesh.kube import KubeError

FAULT_CM = "mindx-dl-fault-config"


async def put_cm(api, ns: str, name: str, data: dict) -> None:
    """Create ConfigMap ``ns/name`` or change its data to exactly ``data`` (one merge patch, the
    keys not in ``data`` set to null: one update event, as ``kubectl apply`` gives)."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }
    try:
        old = await api.get_config_map(ns, name)
    except KubeError as e:
        if e.status != 404:
            raise
        await api.create_config_map(ns, body)
        return
    gone = {k: None for k in (old.get("data") or {}) if k not in data}
    await api.patch_config_map(ns, name, {"data": {**gone, **data}})
    got = (await api.get_config_map(ns, name)).get("data") or {}
    assert got == data, got


def level_at_clusterd(cd, node: str, phy: int, code: str) -> str | None:
    for f in cd.center.faults(node):
        if f.device_type == "NPU" and f.device_id == phy and f.code == code and f.source == "dcmi":
            return f.level
    return None


def failures(app, table: str) -> float:
    return (
        app.registry.get_sample_value("faultmesh_deviced_table_reload_failures_total", {"table": table})
        or 0.0
    )


async def test_fault_config_configmap_changes_a_level_live_and_bad_ones_keep_the_last_good(k8s, kcd):
    emu, api = k8s
    args = deviced_parser().parse_args(
        ["--node-name", "node-2", "--backend", "sim", "--clusterd", f"127.0.0.1:{kcd.grpc_port}"]
        + ["--http-addr", f"127.0.0.1:{free_port()}", "--probe-interval", "0", "--no-switch"]
        + ["--kube", "--kube-api", api.url, "--list-watch-period", "3"]
    )
    sim = SimBackend(1, 8)
    app = DeviceD(args, sim)
    await app.start()
    try:
        await eventually(lambda: app.started and app.fault_cm.synced.is_set(), what="deviced started")
        sim.inject(2, 0x80E18008)
        await eventually(
            lambda: level_at_clusterd(kcd, "node-2", 2, "80E18008") == "RestartNPU", what="default"
        )
        # the operator's override moves 80E18008 to SeparateNPU: live, up to clusterd
        table = {"SeparateNPUCodes": ["80E18008"], "RestartNPUCodes": ["80E18005"]}
        await put_cm(
            api, "kube-system", FAULT_CM, {"faultCode.json": json.dumps(table), "PollInterval": "60"}
        )
        await eventually(
            lambda: level_at_clusterd(kcd, "node-2", 2, "80E18008") == "SeparateNPU", what="override"
        )
        assert app.state.devices[("NPU", 2)].level == "SeparateNPU"
        # a truncated table, an unknown key, a wrong PollInterval: each refused and counted, the
        # override in force stays
        bad = {"faultCode.json": json.dumps(table)[:25], "faultCodes.json": "{}", "PollInterval": "5"}
        await put_cm(api, "kube-system", FAULT_CM, bad)
        await eventually(lambda: failures(app, "faultCode.json") == 1, what="truncated table counted")
        assert failures(app, "unknown-key") == 1 and failures(app, "PollInterval") == 1
        assert app.engine.table.listed_level(0x80E18008).name == "SeparateNPU"
        # wrong types (a list, a number as a table) and an unknown level name
        await put_cm(api, "kube-system", FAULT_CM, {"faultCode.json": json.dumps({"SeparateNPUCodez": []})})
        await eventually(lambda: failures(app, "faultCode.json") == 2, what="unknown level name counted")
        await put_cm(api, "kube-system", FAULT_CM, {"faultCode.json": json.dumps(["80E18008"])})
        await eventually(lambda: failures(app, "faultCode.json") == 3, what="wrong shape counted")
        # a huge table is refused before it is parsed
        huge = json.dumps({"SeparateNPUCodes": ["80E18008"] * 30_000})
        await put_cm(api, "kube-system", FAULT_CM, {"faultCode.json": huge})
        await eventually(lambda: failures(app, "faultCode.json") == 4, what="huge table counted")
        assert app.engine.table.listed_level(0x80E18008).name == "SeparateNPU"
        assert level_at_clusterd(kcd, "node-2", 2, "80E18008") == "SeparateNPU"
        # the ConfigMap goes: the table is faultmesh's default again
        await api.delete_config_map("kube-system", FAULT_CM)
        await eventually(
            lambda: level_at_clusterd(kcd, "node-2", 2, "80E18008") == "RestartNPU", what="reverted"
        )
        assert app.reloader.overrides == {}
    finally:
        await app.stop()


async def test_fault_config_override_of_the_customization_and_switch_tables(k8s, tmp_path):
    """A ConfigMap present at start applies before the first fault; a table file changed under
    an override does not replace it; a removed key gives the table back to its file."""
    emu, api = k8s
    codes = tmp_path / "faultCode.json"
    codes.write_text(json.dumps({"RestartBusinessCodes": ["80E18005"]}))
    rule = {"EventId": ["80E18005"], "TimeWindow": 3600, "Times": 1, "FaultHandling": "ManuallySeparateNPU"}
    await put_cm(
        api, "kube-system", FAULT_CM,
        {"faultCustomization.json": json.dumps({"FaultFrequency": [rule]}),
         "faultCode.json": json.dumps({"SubHealthFaultCodes": ["80E18005"]})},
    )  # fmt: skip
    args = deviced_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}", "--probe-interval", "0"]
        + ["--no-switch", "--fault-code-file", str(codes), "--table-reload-interval", "0.1"]
        + ["--kube", "--kube-api", api.url, "--list-watch-period", "3"]
    )  # fmt: skip
    sim = SimBackend(1, 2)
    app = DeviceD(args, sim)
    await app.start()
    try:
        await eventually(lambda: app.started and app.fault_cm.synced.is_set(), what="deviced started")
        assert app.engine.table.listed_level(0x80E18005).name == "SubHealthFault"
        assert app.engine.custom.frequency_rule(0x80E18005).times == 1
        codes.write_text(json.dumps({"RestartNPUCodes": ["80E18005"]}))  # under the override: ignored
        app.reloader.reload()
        assert app.engine.table.listed_level(0x80E18005).name == "SubHealthFault"
        # the key goes: the file's table comes back; the customization key goes: the default
        await put_cm(api, "kube-system", FAULT_CM, {"PollInterval": "300"})
        await eventually(
            lambda: app.engine.table.listed_level(0x80E18005).name == "RestartNPU", what="file back"
        )
        default = Customization.load().frequency_rule(0x80E18005)
        assert app.engine.custom.frequency_rule(0x80E18005) == default and default.times != 1
        assert failures(app, "PollInterval") == 0 and app.reloader.overrides == {}
        # a switch table override
        sw = {"SubHealthFaultCodes": ["[0x00f1ff09,155914,cpu,na]"]}
        await put_cm(api, "kube-system", FAULT_CM, {"SwitchFaultCode.json": json.dumps(sw)})
        await eventually(
            lambda: app.switch_state.table.level("[0x00f1ff09,155914,cpu,na]") == "SubHealthFault",
            what="switch override",
        )
        # a value of the wrong type (kmock keeps what it is given) is refused, the table stays
        await put_cm(api, "kube-system", FAULT_CM, {"SwitchFaultCode.json": 17})
        await eventually(lambda: failures(app, "SwitchFaultCode.json") == 1, what="wrong type counted")
        assert app.switch_state.table.level("[0x00f1ff09,155914,cpu,na]") == "SubHealthFault"
    finally:
        await app.stop()


NODE_CM = "mindx-dl-node-fault-config"


def noded_level_at_clusterd(cd, node: str, code: str) -> str | None:
    return next((f.level for f in cd.center.faults(node) if f.code == code and f.source == "bmc-oem"), None)


def level_reloads(nd, result: str) -> float:
    return (
        nd.registry.get_sample_value("faultmesh_noded_level_table_reloads_total", {"result": result}) or 0.0
    )


async def test_node_fault_config_configmap_changes_a_level_live(k8s, kcd, tmp_path):
    """noded: the override is in force live (the BMC fault's level changes at clusterd); a code in
    two levels, bad JSON, an unknown key, a wrong type are refused and counted; a deleted ConfigMap
    keeps the last table (as the reference NodeD)."""
    from noded_support import BmcSim

    from noded.app import NodeD
    from noded.app import build_parser as noded_parser

    emu, api = k8s
    sim = await asyncio.to_thread(BmcSim(tmp_path).start)
    args = config.parse(
        noded_parser(),
        ["--node-name", "node-1", "--clusterd", f"127.0.0.1:{kcd.grpc_port}", "--http-addr", "127.0.0.1:0"]
        + ["--bmc-host", "127.0.0.1", "--bmc-port", str(sim.port), "--bmc-password-file", str(sim.password_file)]
        + ["--bmc-user", sim.user, "--poll-interval", "1", "--bmc-timeout", "2", "--min-report-interval", "0"]
        + ["--kube", "--kube-api", api.url],
    )  # fmt: skip
    nd = NodeD(args)
    await nd.start()
    try:
        await eventually(lambda: nd.fault_cm.synced.is_set(), what="noded following its ConfigMap")
        await asyncio.to_thread(sim.add_alarm, "0800004B", "Memory", 3)
        await eventually(
            lambda: noded_level_at_clusterd(kcd, "node-1", "0800004B") == "PreSeparateFault", what="default"
        )
        table = {"FaultTypeCode": {"SeparateFaultCodes": ["0800004B"], "NotHandleFaultCodes": ["0100000D"]}}
        await put_cm(api, "mindx-dl", NODE_CM, {"NodeDConfiguration.json": json.dumps(table)})
        await eventually(
            lambda: noded_level_at_clusterd(kcd, "node-1", "0800004B") == "SeparateFault", what="override"
        )
        assert level_reloads(nd, "ok") == 1
        # refused, counted, the override stays
        twice = {"FaultTypeCode": {"SeparateFaultCodes": ["0800004B"], "NotHandleFaultCodes": ["0800004b"]}}
        await put_cm(api, "mindx-dl", NODE_CM, {"NodeDConfiguration.json": json.dumps(twice)})
        await eventually(lambda: level_reloads(nd, "invalid") == 1, what="code in two levels refused")
        await put_cm(api, "mindx-dl", NODE_CM, {"NodeDConfiguration.json": json.dumps(table)[:30], "x": "1"})
        await eventually(lambda: level_reloads(nd, "invalid") == 2, what="truncated JSON refused")
        assert level_reloads(nd, "unknown-key") == 1
        await put_cm(api, "mindx-dl", NODE_CM, {"NodeDConfiguration.json": ["0800004B"]})
        await eventually(lambda: level_reloads(nd, "invalid") == 3, what="wrong type refused")
        assert nd.bmc.watcher.table.classify("0800004B")[0].name == "SeparateFault"
        # deleted: the last table stays
        await api.delete_config_map("mindx-dl", NODE_CM)
        await eventually(lambda: nd.fault_cm.watcher.objects == {}, what="delete seen")
        assert nd.bmc.watcher.table.classify("0800004B")[0].name == "SeparateFault"
        assert noded_level_at_clusterd(kcd, "node-1", "0800004B") == "SeparateFault"
    finally:
        await nd.stop()
        await asyncio.to_thread(sim.stop)
