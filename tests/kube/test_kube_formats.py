"""The reference ConfigMap formats of Kubernetes mode: Go-compatible CheckCode, parsing with
verification, fault extraction, entry building and deterministic sharding (no API server needed)."""

from __future__ import annotations

import json
import random

import pytest
from kube.kubekit import device_info_cm, node_info_cm

from clusterd.kube import cluster_info, formats
from faultmesh import gojson
from faultmesh.model import Fault

# reference noded.md §4: the worked example and its CheckCode.
NODE_INFO_JSON = (
    '{"FaultDevList":[{"DeviceType":"Memory","DeviceId":3,"FaultCode":["0800004B"],"FaultLevel":"PreSeparateFault"},'
    '{"DeviceType":"Disk","DeviceId":1,"FaultCode":["2C000031","02000007"],"FaultLevel":"SeparateFault"}],'
    '"NodeStatus":"UnHealthy"}'
)
NODE_INFO_CHECK = "fc0411006f1ec49beb34974f5a412dab379ae57f9cc3ad2f2c7837d0243cbc5c"


def test_check_code_matches_the_reference_example():
    info = gojson.canon_node_info(json.loads(NODE_INFO_JSON))
    assert gojson.marshal(info).decode() == NODE_INFO_JSON
    assert gojson.check_code(info) == NODE_INFO_CHECK


def test_go_marshal_escapes_html_and_keeps_utf8():
    assert gojson.marshal({"a": "<x>&\u2028é"}) == '{"a":"\\u003cx\\u003e\\u0026\\u2028é"}'.encode()
    assert gojson.marshal({"l": [], "n": None}) == b'{"l":[],"n":null}'


def test_canonical_shape_follows_go_unmarshal():
    # Field order restored, unknown fields dropped, names matched case-insensitively, missing -> zero.
    messy = {"nodestatus": "Healthy", "Extra": 1, "FaultDevList": [{"deviceid": 7, "DeviceType": "CPU"}]}
    canon = gojson.canon_node_info(messy)
    assert gojson.marshal(canon) == (
        b'{"FaultDevList":[{"DeviceType":"CPU","DeviceId":7,"FaultCode":null,"FaultLevel":""}],"NodeStatus":"Healthy"}'
    )
    # Go sorts map keys: the DeviceList order of the input does not matter.
    a = gojson.canon_device_info({"DeviceList": {"b": "1", "a": "2"}, "UpdateTime": 5})
    assert gojson.marshal(a) == b'{"DeviceList":{"a":"2","b":"1"},"UpdateTime":5}'
    for bad in (
        {"FaultDevList": [{"DeviceId": "3"}]},
        {"FaultDevList": [{"DeviceId": 1.5}]},
        {"NodeStatus": 1},
    ):
        with pytest.raises(gojson.GoTypeError):
            gojson.canon_node_info(bad)


def test_parse_node_info_verifies_check_code():
    info = json.loads(NODE_INFO_JSON)
    doc = formats.parse_node_info(node_info_cm(info, NODE_INFO_CHECK))
    assert doc.info["NodeStatus"] == "UnHealthy"
    assert doc.update_ms == 1767294245000  # 2026-01-02T03:04:05+08:00
    faults = formats.faults_from_node_info("node-01", doc, now_ms=1)
    assert sorted((f.device_type, f.device_id, f.code, f.level) for f in faults) == [
        ("Disk", 1, "02000007", "SeparateFault"),
        ("Disk", 1, "2C000031", "SeparateFault"),
        ("Memory", 3, "0800004B", "PreSeparateFault"),
    ]
    assert {f.first_seen_ms for f in faults} == {1767294245000}
    cases = [
        (node_info_cm(info, "0" * 64), "bad_checkcode"),
        ({"NodeInfo": "{not json"}, "bad_json"),
        ({"NodeInfo": json.dumps({"NodeInfo": {"FaultDevList": "x"}, "CheckCode": "0"})}, "bad_json"),
        ({"updateTime": "x"}, "missing_key"),
    ]
    for data, reason in cases:
        with pytest.raises(formats.BadConfigMap) as e:
            formats.parse_node_info(data)
        assert e.value.reason == reason


def test_device_info_faults_split_per_code_with_per_code_levels():
    faults_json = json.dumps(
        [
            {
                "fault_type": "CardUnhealthy",
                "npu_name": "Ascend910-2",
                "fault_level": "RestartNPU",
                "fault_code": "80E18008,80C98009",
                "fault_time_and_level_map": {
                    "80E18008": {"fault_time": 1767000000123, "fault_level": "RestartNPU"},
                    "80C98009": {"fault_time": 1767000000200, "fault_level": "NotHandleFault"},
                },
            },
            {
                "fault_type": "CardUnhealthy",
                "npu_name": "Ascend910-6",
                "fault_level": "ManuallySeparateNPU",
                "fault_code": "",
                "fault_time_and_level_map": {},
            },
            {
                "fault_type": "PublicFault",
                "npu_name": "Ascend910-1",
                "fault_level": "SeparateNPU",
                "fault_code": "010001001",
            },
        ]
    )
    data = device_info_cm(
        {
            "huawei.com/Ascend910": "Ascend910-0,Ascend910-1",
            "huawei.com/Ascend910-Fault": faults_json,
            "huawei.com/Ascend910-Unhealthy": "Ascend910-2,Ascend910-6",
        }
    )
    doc = formats.parse_device_info(data)
    faults = formats.faults_from_device_info("node-1", doc)
    got = sorted((f.device_id, f.code, f.level, f.first_seen_ms) for f in faults)
    assert got == [
        (2, "80C98009", "NotHandleFault", 1767000000200),
        (2, "80E18008", "RestartNPU", 1767000000123),
        (6, "ManuallySeparateNPU", "ManuallySeparateNPU", 0),
    ]
    bad = device_info_cm({"huawei.com/Ascend910-Fault": "[{"})
    with pytest.raises(formats.BadConfigMap, match="bad_json"):
        formats.faults_from_device_info("n", formats.parse_device_info(bad))
    with pytest.raises(formats.BadConfigMap, match="bad_checkcode"):
        formats.parse_device_info(device_info_cm({"huawei.com/Ascend910": "Ascend910-0"}, check="ab" * 32))


def _f(node, dev, code, level, source="deviced", dtype="NPU", t=1000):
    return Fault(
        source=source,
        node=node,
        device_type=dtype,
        device_id=dev,
        code=code,
        level=level,
        first_seen_ms=t,
        last_seen_ms=t,
    )


def test_device_entry_merges_faults_per_npu_and_marks_unhealthy():
    devices = [
        {"device_id": i, "phy_id": i + 8, "health": "Healthy", "network_health": "Healthy"} for i in range(4)
    ]
    devices[3]["network_health"] = "UnHealthy"
    faults = [  # device_id = physical id (logic 1 -> phy 9, logic 2 -> phy 10)
        _f("n", 9, "80E18008", "RestartNPU"),
        _f("n", 9, "80C98009", "NotHandleFault"),
        _f("n", 10, "80818C05", "SubHealthFault"),
    ]
    e = cluster_info.build_device_entry("n", "Ascend910", faults, devices)
    dl = e["DeviceList"]
    assert dl["huawei.com/Ascend910"] == "Ascend910-8,Ascend910-10,Ascend910-11"
    assert dl["huawei.com/Ascend910-Unhealthy"] == "Ascend910-9"
    assert dl["huawei.com/Ascend910-NetworkUnhealthy"] == "Ascend910-11"
    fl = json.loads(dl["huawei.com/Ascend910-Fault"])
    assert [(x["npu_name"], x["fault_code"], x["fault_level"]) for x in fl] == [
        ("Ascend910-9", "80C98009,80E18008", "RestartNPU"),
        ("Ascend910-10", "80818C05", "SubHealthFault"),
    ]
    assert fl[0]["fault_time_and_level_map"]["80C98009"] == {
        "fault_time": 1000,
        "fault_level": "NotHandleFault",
    }
    assert e["CmName"] == "mindx-dl-deviceinfo-n"


def test_node_entry_status_from_worst_level():
    e = cluster_info.build_node_entry(
        "n",
        [
            _f("n", 3, "0800004B", "PreSeparateFault", dtype="Memory"),
            _f("n", 1, "2C000031", "SeparateFault", dtype="Disk"),
        ],
    )
    assert e["NodeStatus"] == "UnHealthy"
    assert e["FaultDevList"][0] == {
        "DeviceType": "Disk",
        "DeviceId": 1,
        "FaultCode": ["2C000031"],
        "FaultLevel": "SeparateFault",
    }
    assert cluster_info.build_node_entry("n", [], agent_status="PreSeparate")["NodeStatus"] == "PreSeparate"


def test_sharding_is_deterministic_and_bounded():
    entries = {
        f"mindx-dl-deviceinfo-node-{i:04d}": {"DeviceList": {"x": "y" * (50 + i % 7)}, "CmName": str(i)}
        for i in range(300)
    }
    shards = cluster_info.shard(entries, max_bytes=4096)
    assert len(shards) > 5
    assert all(len(s.encode()) <= 4096 for s in shards)
    merged = {}
    for s in shards:
        merged.update(json.loads(s))
    assert merged == entries
    items = list(entries.items())
    random.Random(7).shuffle(items)
    assert cluster_info.shard(dict(items), max_bytes=4096) == shards
    assert cluster_info.shard({}, 100) == []
    huge = {"k": {"v": "z" * 500}}
    assert len(cluster_info.shard(huge, 100)) == 1


def test_job_spec_from_pods_follows_the_reference_rank_rule():
    from clusterd.kube import jobs as kjobs

    def pod(name, node, idx, devs, phase="Running", **ann):
        conf = {"devices": [{"device_id": str(d)} for d in devs]}
        return {
            "metadata": {
                "name": name,
                "annotations": {
                    "ascend.kubectl.kubernetes.io/ascend-910-configuration": json.dumps(conf),
                    "hccl/rankIndex": str(idx),
                    **ann,
                },
            },
            "spec": {"nodeName": node},
            "status": {"phase": phase},
        }

    spec = kjobs.job_spec("u1", "job", "ns", [pod("b", "n2", 1, [7, 3]), pod("a", "n1", 0, [2, 0])])
    assert [(r["rank"], r["node"], r["device"]) for r in spec["ranks"]] == [
        (0, "n1", 0),
        (1, "n1", 2),
        (2, "n2", 3),
        (3, "n2", 7),
    ]
    assert spec["status"] == "running"
    assert kjobs.job_status([{"status": {"phase": "Succeeded"}}] * 2) == "completed"
    assert kjobs.job_status([{"status": {"phase": "Running"}}, {"status": {"phase": "Failed"}}]) == "failed"
    with pytest.raises(kjobs.BadPod, match="same hccl/rankIndex"):
        kjobs.job_spec("u1", "job", "ns", [pod("a", "n1", 0, [0]), pod("b", "n2", 0, [0])])
    with pytest.raises(kjobs.BadPod, match="not JSON"):
        bad = pod("a", "n1", 0, [0])
        bad["metadata"]["annotations"]["ascend.kubectl.kubernetes.io/ascend-910-configuration"] = "{"
        kjobs.job_spec("u1", "job", "ns", [bad])
    unscheduled = pod("c", "n3", 2, [1])
    unscheduled["spec"] = {}
    assert len(kjobs.job_spec("u1", "job", "ns", [unscheduled])["ranks"]) == 0


@pytest.mark.parametrize(
    ("env_on", "value", "wait_s"),
    [(0, "120", 110), (0, "5", 20), (0, "abc", 20), (0, "99999", 20), (1, "120", 20), (None, None, 20)],
)
def test_mindio_wait_comes_from_the_rank0_pods_env(env_on, value, wait_s):
    """clusterd.md §7.1: the rank-0 pod's MINDIO_WAIT_MINDX_TIME sets elastic training's resource
    wait (value - 10 s for 10..3600); another pod's, a bad or an absent value leaves the 20 s default."""
    from clusterd.brain.reschedule import resource_wait_s
    from clusterd.kube import jobs as kjobs
    from faultmesh.jobspec import parse_job

    def pod(name, node, idx):
        conf = {"devices": [{"device_id": "0"}]}
        env = [{"name": "OTHER", "value": "1"}]
        if idx == env_on:
            env.append({"name": "MINDIO_WAIT_MINDX_TIME", "value": value})
        return {
            "metadata": {
                "name": name,
                "annotations": {
                    "ascend.kubectl.kubernetes.io/ascend-910-configuration": json.dumps(conf),
                    "hccl/rankIndex": str(idx),
                },
            },
            "spec": {"nodeName": node, "containers": [{"name": "sidecar"}, {"name": "train", "env": env}]},
            "status": {"phase": "Running"},
        }

    job = parse_job(kjobs.job_spec("u1", "job", "ns", [pod("a", "n1", 0), pod("b", "n2", 1)]))
    assert resource_wait_s(job) == wait_s
