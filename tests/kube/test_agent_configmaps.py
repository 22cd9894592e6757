"""``noded --kube`` / ``deviced --kube`` publish the reference agents' ConfigMaps (issue 15): clusterd's
reference-format consumer reads them, and they compare byte for byte with the reference document of
the same state (reference noded.md §4, deviced.md §5.1). Unit tests of the write policy too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest
from kube.test_kube_formats import NODE_INFO_CHECK, NODE_INFO_JSON
from prometheus_client import CollectorRegistry
from support import eventually, free_port

from deviced.app import DeviceD
from deviced.app import build_parser as deviced_parser
from deviced.backends import SimBackend
from deviced.sinks import kube_deviceinfo
from faultmesh import config
from faultmesh.kube import KubeError
from faultmesh.kubecm import ConfigMapPublisher
from faultmesh.model import Fault
from noded.app import NodeD
from noded.app import build_parser as noded_parser
from noded.bmc.faults import SOURCE_OEM
from noded.sinks import kube_nodeinfo


async def get_cm(api, ns, name):
    try:
        return await api.get_config_map(ns, name)
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def kube_faults(cd, node, source):
    return sorted(
        (f.device_type, f.device_id, f.code, f.level) for f in cd.center.faults(node) if f.source == source
    )


async def test_noded_publishes_the_reference_node_info(k8s, kcd):
    emu, api = k8s
    args = config.parse(
        noded_parser(()),
        ["--node-name", "node-1", "--clusterd", f"127.0.0.1:{kcd.grpc_port}", "--http-addr", "127.0.0.1:0"]
        + ["--min-report-interval", "0", "--kube", "--kube-api", api.url],
    )
    nd = NodeD(args, ())
    await nd.start()
    try:
        f = lambda t, i, c, lv: Fault(SOURCE_OEM, "node-1", t, i, c, lv)  # noqa: E731
        nd.state.replace_source(
            SOURCE_OEM,
            [
                f("Memory", 3, "0800004B", "PreSeparateFault"),
                f("Disk", 1, "2C000031", "SeparateFault"),
                f("Disk", 1, "02000007", "SeparateFault"),
            ],
        )
        cm = await eventually(
            lambda: get_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-1"), what="node-info CM"
        )
        assert cm["metadata"]["labels"] == {"mx-consumer-cim": "true"}
        assert set(cm["data"]) == {"NodeInfo", "updateTime"}
        # byte for byte the reference NodeD's document of this state (noded.md §4's worked example)
        assert (
            cm["data"]["NodeInfo"]
            == '{"NodeInfo":' + NODE_INFO_JSON + ',"CheckCode":"' + NODE_INFO_CHECK + '"}'
        )
        # clusterd's reference-format consumer accepts it (CheckCode verified)
        await eventually(lambda: kube_faults(kcd, "node-1", "kube:nodeinfo"), what="consumed")
        assert kube_faults(kcd, "node-1", "kube:nodeinfo") == [
            ("Disk", 1, "02000007", "SeparateFault"),
            ("Disk", 1, "2C000031", "SeparateFault"),
            ("Memory", 3, "0800004B", "PreSeparateFault"),
        ]
        # healthy again: the ConfigMap is deleted (as the reference does), clusterd clears the faults
        nd.state.replace_source(SOURCE_OEM, [])
        await eventually(
            lambda: not kube_faults(kcd, "node-1", "kube:nodeinfo"), what="cleared after the CM was deleted"
        )
        assert await get_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-1") is None
    finally:
        await nd.stop()


def _reference_device_info_cfg(update_s: int, fault_ms: int) -> str:
    """The reference device plugin's ``DeviceInfoCfg`` for 8 chips, chip 2 with 80E18008 (RestartNPU):
    Go's json.Marshal of NodeDeviceInfoCache (deviced.md §5.1), written out by hand; the simulator
    reports no super pod (0xffffffff: -1)."""
    fault = (
        '[{"fault_type":"CardUnhealthy","npu_name":"Ascend910-2","large_model_fault_level":"RestartNPU",'
        '"fault_level":"RestartNPU","fault_handling":"RestartNPU","fault_code":"80E18008",'
        '"fault_time_and_level_map":{"80E18008":{"fault_time":FAULT_MS,"fault_level":"RestartNPU"}}}]'
    ).replace("FAULT_MS", str(fault_ms))
    free = ",".join(f"Ascend910-{i}" for i in (0, 1, 3, 4, 5, 6, 7))
    device_info = (
        '{"DeviceList":{"huawei.com/Ascend910":"FREE","huawei.com/Ascend910-Fault":FAULT,'
        '"huawei.com/Ascend910-NetworkUnhealthy":"","huawei.com/Ascend910-Recovering":"",'
        '"huawei.com/Ascend910-Unhealthy":"Ascend910-2"},"UpdateTime":UPDATE}'
    )
    device_info = (
        device_info.replace("FREE", free).replace("FAULT", json.dumps(fault)).replace("UPDATE", str(update_s))
    )
    check = hashlib.sha256(device_info.encode()).hexdigest()
    return '{"DeviceInfo":' + device_info + ',"SuperPodID":-1,"ServerIndex":-1,"CheckCode":"' + check + '"}'


async def test_deviced_publishes_the_reference_device_info(k8s, kcd):
    emu, api = k8s
    args = deviced_parser().parse_args(
        ["--node-name", "node-2", "--backend", "sim", "--clusterd", f"127.0.0.1:{kcd.grpc_port}"]
        + ["--http-addr", f"127.0.0.1:{free_port()}", "--probe-interval", "0", "--no-switch"]
        + ["--kube", "--kube-api", api.url]
    )
    sim = SimBackend(1, 8)
    app = DeviceD(args, sim)
    await app.start()
    try:
        await eventually(lambda: app.started, what="deviced started")
        sim.inject(2, 0x80E18008)

        async def faulty():
            cm = await get_cm(api, "kube-system", "mindx-dl-deviceinfo-node-2")
            return cm if cm and 'Unhealthy":"Ascend910-2' in cm["data"].get("DeviceInfoCfg", "") else None

        cm = await eventually(faulty, what="device-info CM with the fault")
        assert cm["metadata"]["labels"] == {"mx-consumer-cim": "true"}
        data = cm["data"]
        assert set(data) == {
            "DeviceInfoCfg", "SwitchInfoCfg", "ManuallySeparateNPU", "UpgradeFaultReason", "Description"
        }  # fmt: skip
        cfg = json.loads(data["DeviceInfoCfg"])
        fault_ms = json.loads(cfg["DeviceInfo"]["DeviceList"]["huawei.com/Ascend910-Fault"])[0][
            "fault_time_and_level_map"
        ]["80E18008"]["fault_time"]
        assert data["DeviceInfoCfg"] == _reference_device_info_cfg(cfg["DeviceInfo"]["UpdateTime"], fault_ms)
        assert data["ManuallySeparateNPU"] == "" and data["UpgradeFaultReason"] == "{}"
        await eventually(lambda: kube_faults(kcd, "node-2", "kube:deviceinfo"), what="consumed by clusterd")
        assert kube_faults(kcd, "node-2", "kube:deviceinfo") == [("NPU", 2, "80E18008", "RestartNPU")]
    finally:
        await app.stop()


# -- the write policy, without an API server -----------------------------------------------------
class FakeApi:
    def __init__(self):
        self.calls: list[tuple[str, dict | None]] = []
        self.fail = 0

    async def upsert_config_map(self, ns, name, data, labels):
        if self.fail:
            self.fail -= 1
            raise KubeError("update configmap", 500, "boom")
        self.calls.append(("upsert", data))

    async def delete_config_map(self, ns, name):
        self.calls.append(("delete", None))
        raise KubeError("delete configmap", 404)


async def test_unchanged_documents_wait_for_the_refresh_and_failures_retry():
    t = [0.0]
    api = FakeApi()
    registry = CollectorRegistry()
    p = ConfigMapPublisher(
        api, "ns", "cm", {}, registry, refresh_s=1800, min_interval_s=0, same=kube_nodeinfo.same,
        clock=lambda: t[0],
    )  # fmt: skip
    info = json.loads(NODE_INFO_JSON)
    doc = lambda i, when: {"NodeInfo": json.dumps({"NodeInfo": i, "CheckCode": "x"}), "updateTime": when}  # noqa: E731
    p.offer(doc(info, "a"))
    assert await p.write_once() and len(api.calls) == 1
    # only updateTime and the code order differ: skipped (the 30-minute rule) ...
    reordered = json.loads(NODE_INFO_JSON)
    reordered["FaultDevList"][1]["FaultCode"].reverse()
    p.offer(doc(reordered, "b"))
    assert not await p.write_once()
    t[0] = 1800.0  # ... until 30 min passed
    assert await p.write_once() and len(api.calls) == 2
    # a changed level is written at once; a failure raises and the same write is retried
    info["FaultDevList"][0]["FaultLevel"] = "SeparateFault"
    p.offer(doc(info, "c"))
    api.fail = 1
    with pytest.raises(KubeError):
        await p.write_once()
    assert await p.write_once() and len(api.calls) == 3
    p.offer(None)
    assert await p.write_once() and api.calls[-1] == ("delete", None)  # 404 on delete is fine
    assert not await p.write_once()
    # counted under clusterd's label set of the same series name (kind, result)
    writes = lambda result: registry.get_sample_value(  # noqa: E731
        "faultmesh_kube_writes_total", {"kind": "configmap", "result": result}
    )
    assert (writes("ok"), writes("error")) == (4.0, 1.0)


def test_device_info_change_check_ignores_times():
    a = {
        "DeviceInfoCfg": json.dumps(
            {
                "DeviceInfo": {
                    "DeviceList": {
                        "huawei.com/Ascend910-Fault": json.dumps(
                            [
                                {
                                    "npu_name": "Ascend910-1",
                                    "fault_time_and_level_map": {"X": {"fault_time": 1}},
                                }
                            ]
                        )
                    },
                    "UpdateTime": 5,
                },
                "CheckCode": "aa",
            }
        ),
        "ManuallySeparateNPU": "",
    }
    b = json.loads(json.dumps(a))
    b["DeviceInfoCfg"] = b["DeviceInfoCfg"].replace('\\"fault_time\\": 1', '\\"fault_time\\": 2')
    b["DeviceInfoCfg"] = b["DeviceInfoCfg"].replace('"UpdateTime": 5', '"UpdateTime": 9')
    assert b != a and kube_deviceinfo.same(a, b)
    b["ManuallySeparateNPU"] = "Ascend910-1"
    assert not kube_deviceinfo.same(a, b)


async def test_run_loop_writes_within_a_second(k8s):
    emu, api = k8s
    p = ConfigMapPublisher(
        api, "mindx-dl", "mindx-dl-nodeinfo-x", {"mx-consumer-cim": "true"}, min_interval_s=0.05
    )
    task = asyncio.get_running_loop().create_task(p.run())
    try:
        p.offer({"k": "v"})
        cm = await eventually(
            lambda: get_cm(api, "mindx-dl", "mindx-dl-nodeinfo-x"), timeout_s=2, what="written"
        )
        assert cm["data"] == {"k": "v"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
