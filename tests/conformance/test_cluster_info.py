"""cluster-info written from faultmesh's own agents as the reference's ClusterD writes it from the
device plugin's ConfigMap (issue 14 items 7 and 8).

Reference: the device plugin's DeviceInfoCfg carries SuperPodID / ServerIndex from
``dcmi_get_device_info(CHIP_INF)`` (deviced.md §5.1: -1 when unset, -2 unsupported or failed) and
ClusterD copies them into ``cluster-info-device-<i>`` (clusterd.md §6.5); Volcano skips a node
whose SuperPodID < 0 on A3 super pods. SwitchInfoCfg.FaultCode is a list of JSON
SimpleSwitchFaultInfo records {EventType, AssembledFaultCode, PeerPortDevice, PeerPortId,
SwitchChipId, SwitchPortId, Severity, Assertion, AlarmRaisedTime} and FaultTimeAndLevelMap is keyed
``<code>_<chipId>_<portId>`` (deviced.md §7, ascend-device-plugin pkg/common/device.go), copied
into ``cluster-info-switch-<i>``.
"""

from __future__ import annotations

import json

import pytest
from kube.conftest import k8s, kcd  # noqa: F401 (fixtures)
from kube.test_kube_mode import published
from support import eventually, free_port

from deviced.app import DeviceD
from deviced.app import build_parser as deviced_parser
from deviced.backends import SimBackend
from deviced.sinks.deviceinfo import switch_info

pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")


def deviced(kcd, sim: SimBackend, *flags: str) -> DeviceD:  # noqa: F811
    args = deviced_parser().parse_args(
        ["--node-name", "node-2", "--backend", "sim", "--clusterd", f"127.0.0.1:{kcd.grpc_port}"]
        + ["--http-addr", f"127.0.0.1:{free_port()}", "--probe-interval", "0", *flags]
    )
    return DeviceD(args, sim)


async def test_super_pod_id_and_server_index_come_from_faultmesh_deviced(k8s, kcd):  # noqa: F811
    emu, api = k8s
    sim = SimBackend(1, 8)
    sim.super_pod = (2, 5)  # an A3 super pod: the driver's super_pod_id / server_id
    app = deviced(kcd, sim, "--no-switch")
    await app.start()
    try:

        async def entry():
            e = ((await published(api, "cluster-info-device-0")) or {}).get("mindx-dl-deviceinfo-node-2")
            return e if e and e["SuperPodID"] != -2 else None

        e = await eventually(entry, what="node-2 with its super pod")
        # before issue 14 both were -2 although deviced reported them
        assert (e["SuperPodID"], e["ServerIndex"], e["RackID"]) == (2, 5, -2)
    finally:
        await app.stop()


async def test_switch_fault_codes_are_the_reference_json_records(k8s, kcd):  # noqa: F811
    emu, api = k8s
    sim = SimBackend(1, 8)
    app = deviced(kcd, sim)
    await app.start()
    try:
        await eventually(lambda: app.started, what="deviced started")
        # [0x00f1fef5,155914,npu,na] is RestartRequest in the default SwitchFaultCode.json
        sim.switch.fire(0x00F1FEF5, 155914, 1, 7, 0, 3, 2, 1)

        async def entry():
            return ((await published(api, "cluster-info-switch-0")) or {}).get("mindx-dl-switchinfo-node-2")

        e = await eventually(entry, what="node-2's switch entry")
        (item,) = e["FaultCode"]
        rec = json.loads(item)
        assert list(rec) == [
            "EventType", "AssembledFaultCode", "PeerPortDevice", "PeerPortId", "SwitchChipId",
            "SwitchPortId", "Severity", "Assertion", "AlarmRaisedTime",
        ]  # fmt: skip
        assert (rec["EventType"], rec["AssembledFaultCode"], rec["PeerPortDevice"], rec["PeerPortId"]) == (
            0x00F1FEF5,
            "[0x00f1fef5,155914,npu,na]",
            1,
            7,
        )
        assert (rec["SwitchChipId"], rec["SwitchPortId"], rec["Severity"], rec["Assertion"]) == (0, 3, 2, 1)
        assert list(e["FaultTimeAndLevelMap"]) == ["[0x00f1fef5,155914,npu,na]_0_3"]
        assert (
            e["FaultTimeAndLevelMap"]["[0x00f1fef5,155914,npu,na]_0_3"]["fault_time"]
            == rec["AlarmRaisedTime"]
        )
        assert (e["FaultLevel"], e["NodeStatus"]) == ("RestartRequest", "UnHealthy")
        # the same record, byte for byte, as deviced's own device-info SwitchInfoCfg
        assert switch_info(app, 0)["FaultCode"] == [item]
    finally:
        await app.stop()
