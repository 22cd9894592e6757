"""The device-info document (reference deviced.md §5.1), on the sim backend; read back by clusterd's kube reader."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend
from deviced.engine import OCCUR, DeviceEvent
from deviced.sinks import deviceinfo
from faultmesh.dcmi.lingqu import SwitchEvent


def sw(event_type, fault_id, peer, chip, port, assertion=1, peer_port=0):
    return SwitchEvent(event_type, fault_id, peer, peer_port, chip, port, 2, assertion, 1, 0, 1000)


async def test_device_info_document(tmp_path):
    args = build_parser().parse_args(
        [
            "--node-name",
            "n1",
            "--backend",
            "sim",
            "--clusterd",
            f"127.0.0.1:{free_port()}",
            "--probe-interval",
            "0",
        ]
    )
    sim = SimBackend(1, 8)
    app = DeviceD(args, sim)
    await app.init_backend()
    sim.devs[2].codes.append(0x80E18008)
    sim.devs[5].codes.append(0x81078603)
    await app.run_cycle()
    # the link has been down 40 s: escalated by the 20 s rule
    app.engine.devices[5].last_event_ms.clear()
    app.engine.devices[5].network.clear()
    app.engine.submit(DeviceEvent(5, 0x81078603, OCCUR, 0, app.engine.now() - 40_000, "poll"))
    app.engine.cycle()
    sim.switch.fire(0x00F1FEF5, 155914, 1, 0, 0, 3, 2, 1)
    app.switch_state.replace(sim.switch.fault_info())
    doc = deviceinfo.build(app)
    assert doc["metadata"]["name"] == "mindx-dl-deviceinfo-n1"
    cfg = json.loads(doc["data"]["DeviceInfoCfg"])
    dl = cfg["DeviceInfo"]["DeviceList"]
    assert dl["huawei.com/Ascend910"] == ",".join(f"Ascend910-{i}" for i in (0, 1, 3, 4, 5, 6, 7))
    assert dl["huawei.com/Ascend910-Unhealthy"] == "Ascend910-2"
    assert dl["huawei.com/Ascend910-NetworkUnhealthy"] == "Ascend910-5"
    faults = json.loads(dl["huawei.com/Ascend910-Fault"])
    by = {(f["npu_name"], f["fault_type"]): f for f in faults}
    chip = by[("Ascend910-2", "CardUnhealthy")]
    assert chip["fault_level"] == "RestartNPU" and chip["fault_code"] == "80E18008"
    net = by[("Ascend910-5", "CardNetworkUnhealthy")]
    assert net["fault_level"] == "PreSeparateNPU"
    assert net["fault_time_and_level_map"]["81078603"]["fault_level"] == "PreSeparateNPU"
    compact = json.dumps(cfg["DeviceInfo"], sort_keys=True, separators=(",", ":"))
    assert cfg["CheckCode"] == hashlib.sha256(compact.encode()).hexdigest()
    reasons = json.loads(doc["data"]["UpgradeFaultReason"])
    assert reasons["Ascend910-5"][0]["upgrade_type"] == "FaultDuration"
    swi = json.loads(doc["data"]["SwitchInfoCfg"])
    assert swi["FaultLevel"] == "RestartRequest" and swi["NodeStatus"] == "UnHealthy"
    assert list(swi["FaultTimeAndLevelMap"]) == ["[0x00f1fef5,155914,npu,na]_0_3"]
    app.blocking.shutdown()
    app.probe_pool.shutdown()


def test_print_device_info_cli():
    exe = Path(sys.executable).parent / "deviced"
    out = subprocess.run(
        [
            str(exe),
            "--backend",
            "sim",
            "--node-name",
            "cli-node",
            "--print-device-info",
            "--log-level",
            "ERROR",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (
        json.loads(doc["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"]["huawei.com/Ascend910-Unhealthy"]
        == ""
    )


async def test_device_info_is_accepted_by_clusterd_kube_reader():
    """The document deviced renders passes clusterd's Go-compatible device-info reader (CheckCode)."""
    import pytest

    formats = pytest.importorskip("clusterd.kube.formats")
    args = build_parser().parse_args(
        [
            "--node-name",
            "n2",
            "--backend",
            "sim",
            "--clusterd",
            f"127.0.0.1:{free_port()}",
            "--probe-interval",
            "0",
        ]
    )
    sim = SimBackend(1, 8)
    app = DeviceD(args, sim)
    await app.init_backend()
    sim.devs[6].codes.append(0x80E18008)
    sim.devs[3].codes.append(0x110001024)
    await app.run_cycle()
    doc = formats.parse_device_info(deviceinfo.build(app)["data"])
    assert doc.device_list["huawei.com/Ascend910-Unhealthy"] == "Ascend910-6"
    assert doc.device_list["huawei.com/Ascend910-NetworkUnhealthy"] == "Ascend910-3"
    assert doc.super_pod_id == -1 and doc.server_index == -1
    app.blocking.shutdown()
    app.probe_pool.shutdown()
