"""clusterd ``--kube`` against kmock's Kubernetes API emulator (ecosystem.md §4.2): publish, consume,
public-fault ConfigMaps, node annotation, and an API server that answers 409/410/500 and drops watches.

clusterd runs in-process on free loopback ports with every registered component; the emulator
serves the Kubernetes API on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from kube.kubekit import device_info_cm, job_pod, kube_clusterd, node_info_cm
from support import eventually, make_clusterd

from faultmesh.kube import KubeError
from faultmesh.model import Fault

kmock = pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")
pytest.importorskip("kubernetes_asyncio", reason="kubernetes_asyncio not installed")

PUB = "mindx-dl"
CIM = {"mx-consumer-cim": "true"}


def kube(cd):
    return next(c for c in cd.components if c.name == "kube")


async def published(api, name: str) -> dict | None:
    """The JSON map in published ConfigMap ``name`` ({} for "", None when absent)."""
    try:
        cm = await api.get_config_map(PUB, name)
    except KubeError as e:
        if e.status == 404:
            return None
        raise
    value = (cm.get("data") or {}).get(name)
    if value is None:
        return None
    return json.loads(value) if value else {}


def rejected(cd, reason: str) -> float:
    return (
        cd.registry.get_sample_value(
            "faultmesh_rejected_requests_total", {"service": "kube", "reason": reason}
        )
        or 0
    )


async def create_cm(api, ns: str, name: str, data: dict, labels: dict | None = None):
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": labels or dict(CIM)},
        "data": data,
    }
    return await api.create_config_map(ns, body)


async def test_publishes_cluster_info_and_writes_only_on_change(k8s, kcd):
    emu, api = k8s
    await kcd.center.upsert(Fault("deviced", "node-1", "NPU", 2, "80E18008", "RestartNPU"), origin="deviced")
    await kcd.center.upsert(
        Fault("noded", "node-2", "Memory", 3, "0800004B", "SeparateFault"), origin="noded"
    )
    dev = await eventually(lambda: published(api, "cluster-info-device-0"), what="device shard")
    entry = dev["mindx-dl-deviceinfo-node-1"]
    assert entry["CmName"] == "mindx-dl-deviceinfo-node-1"
    assert entry["DeviceList"]["huawei.com/Ascend910-Unhealthy"] == "Ascend910-2"
    faults = json.loads(entry["DeviceList"]["huawei.com/Ascend910-Fault"])
    assert [(f["npu_name"], f["fault_code"], f["fault_level"]) for f in faults] == [
        ("Ascend910-2", "80E18008", "RestartNPU")
    ]
    node_cm = await eventually(lambda: published(api, "cluster-info-node-cm"), what="node cm")
    assert node_cm["mindx-dl-nodeinfo-node-2"]["NodeStatus"] == "UnHealthy"
    assert node_cm["mindx-dl-nodeinfo-node-2"]["FaultDevList"] == [
        {"DeviceType": "Memory", "DeviceId": 3, "FaultCode": ["0800004B"], "FaultLevel": "SeparateFault"}
    ]
    cm = await api.get_config_map(PUB, "cluster-info-device-0")
    assert cm["metadata"]["labels"]["mx-consumer-volcano"] == "true"
    # Nothing changes -> nothing is written, however often the publisher wakes up.
    comp = kube(kcd)
    writes = kcd.registry.get_sample_value(
        "faultmesh_kube_writes_total", {"kind": "configmap", "result": "ok"}
    )
    update_time = entry["UpdateTime"]
    for _ in range(5):
        comp.publisher._dirty.set()
        await asyncio.sleep(0.1)
    assert (
        kcd.registry.get_sample_value("faultmesh_kube_writes_total", {"kind": "configmap", "result": "ok"})
        == writes
    )
    # A change on node-1 rewrites the device shard; node-2's entry keeps its UpdateTime.
    await asyncio.sleep(1.1)
    await kcd.center.upsert(
        Fault("deviced", "node-1", "NPU", 5, "81078603", "PreSeparateNPU"), origin="deviced"
    )

    async def changed():
        d = await published(api, "cluster-info-device-0")
        return (
            d
            if "Ascend910-5" in d["mindx-dl-deviceinfo-node-1"]["DeviceList"]["huawei.com/Ascend910-Fault"]
            else None
        )

    dev2 = await eventually(changed, what="device shard update")
    assert dev2["mindx-dl-deviceinfo-node-1"]["UpdateTime"] > update_time
    assert (await published(api, "cluster-info-node-cm"))["mindx-dl-nodeinfo-node-2"]["UpdateTime"] == (
        node_cm["mindx-dl-nodeinfo-node-2"]["UpdateTime"]
    )


async def test_sharding_grows_and_surplus_shards_are_emptied(k8s, tmp_path):
    emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, "--kube-shard-bytes", "2048")
    try:
        faults = [
            Fault("deviced", f"node-{i:03d}", "NPU", d, "80E18008", "RestartNPU")
            for i in range(40)
            for d in (0, 1)
        ]
        await cd.center.apply(faults, [], "deviced")

        async def all_shards():
            out, i = [], 0
            while (s := await published(api, f"cluster-info-device-{i}")) is not None:
                out.append(s)
                i += 1
            return out if sum(len(s) for s in out) == 40 else None

        shards = await eventually(all_shards, what="40 nodes over 4+ shards")
        assert len(shards) >= 4
        merged = {k: v for s in shards for k, v in s.items()}
        assert sorted(merged) == [f"mindx-dl-deviceinfo-node-{i:03d}" for i in range(40)]
        for n in range(len(shards)):
            cm = await api.get_config_map(PUB, f"cluster-info-device-{n}")
            assert len(cm["data"][f"cluster-info-device-{n}"].encode()) <= 2048
        # Node order decides the shard: the first shard holds the first nodes.
        assert min(shards[0]) == "mindx-dl-deviceinfo-node-000"
        # Fewer faults -> fewer shards; the surplus ones are emptied, not left stale.
        await cd.center.apply([], [f.key for f in faults if f.node != "node-000"], "deviced")
        await eventually(
            lambda: _is_empty(published(api, f"cluster-info-device-{len(shards) - 1}")), what="emptied shard"
        )
        assert list(await published(api, "cluster-info-device-0")) == ["mindx-dl-deviceinfo-node-000"]
    finally:
        await cd.stop()


async def test_consumes_reference_node_info_with_check_code(k8s, kcd):
    emu, api = k8s
    info = {
        "FaultDevList": [
            {"DeviceType": "Disk", "DeviceId": 1, "FaultCode": ["2C000031"], "FaultLevel": "SeparateFault"}
        ],
        "NodeStatus": "UnHealthy",
    }
    await create_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-1", node_info_cm(info))
    f = await eventually(
        lambda: [f for f in kcd.center.faults("node-1") if f.source == "kube:nodeinfo"], what="node fault"
    )
    assert [(x.device_type, x.device_id, x.code, x.level) for x in f] == [
        ("Disk", 1, "2C000031", "SeparateFault")
    ]
    node_cm = await eventually(lambda: published(api, "cluster-info-node-cm"), what="node cm")
    assert node_cm["mindx-dl-nodeinfo-node-1"]["NodeStatus"] == "UnHealthy"
    # A bad CheckCode is rejected and counted; the previous faults stay.
    await api.patch_config_map(
        "mindx-dl", "mindx-dl-nodeinfo-node-1", {"data": node_info_cm(info, check="0" * 64)}
    )
    await eventually(lambda: rejected(kcd, "bad_checkcode") >= 1, what="bad_checkcode counted")
    assert [x.code for x in kcd.center.faults("node-1") if x.source == "kube:nodeinfo"] == ["2C000031"]
    # Bad JSON is rejected too.
    await api.patch_config_map("mindx-dl", "mindx-dl-nodeinfo-node-1", {"data": {"NodeInfo": "{oops"}})
    await eventually(lambda: rejected(kcd, "bad_json") >= 1, what="bad_json counted")
    # Deleting the ConfigMap clears its faults.
    await api._call(
        "delete configmap", api.core.delete_namespaced_config_map, "mindx-dl-nodeinfo-node-1", "mindx-dl"
    )
    await eventually(
        lambda: not [x for x in kcd.center.faults("node-1") if x.source == "kube:nodeinfo"], what="cleared"
    )


async def test_unknown_node_is_rejected_until_the_node_appears(k8s, kcd):
    emu, api = k8s
    info = {
        "FaultDevList": [
            {"DeviceType": "CPU", "DeviceId": 0, "FaultCode": ["00000001"], "FaultLevel": "PreSeparateFault"}
        ],
        "NodeStatus": "PreSeparate",
    }
    await create_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-9", node_info_cm(info))
    await eventually(lambda: rejected(kcd, "unknown_node") >= 1, what="unknown_node counted")
    assert kcd.center.faults("node-9") == []
    await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-9"}})
    await eventually(lambda: kcd.center.faults("node-9"), what="applied after the node appeared")


async def test_consumes_reference_device_info_and_republishes_it(k8s, kcd):
    emu, api = k8s
    fault = [
        {
            "fault_type": "CardUnhealthy",
            "npu_name": "Ascend910-2",
            "fault_level": "RestartNPU",
            "large_model_fault_level": "RestartNPU",
            "fault_handling": "RestartNPU",
            "fault_code": "80E18008",
            "fault_time_and_level_map": {
                "80E18008": {"fault_time": 1767000000123, "fault_level": "RestartNPU"}
            },
        }
    ]
    dl = {
        "huawei.com/Ascend910": "Ascend910-0,Ascend910-1,Ascend910-3",
        "huawei.com/Ascend910-Unhealthy": "Ascend910-2",
        "huawei.com/Ascend910-NetworkUnhealthy": "",
        "huawei.com/Ascend910-Recovering": "",
        "huawei.com/Ascend910-Fault": json.dumps(fault),
    }
    await create_cm(api, "kube-system", "mindx-dl-deviceinfo-node-2", device_info_cm(dl))
    f = await eventually(lambda: kcd.center.faults("node-2"), what="device fault")
    assert [(x.device_id, x.code, x.level, x.first_seen_ms) for x in f] == [
        (2, "80E18008", "RestartNPU", 1767000000123)
    ]
    dev = await eventually(lambda: published(api, "cluster-info-device-0"), what="device shard")
    out = dev["mindx-dl-deviceinfo-node-2"]["DeviceList"]
    assert out["huawei.com/Ascend910"] == "Ascend910-0,Ascend910-1,Ascend910-3"
    assert out["huawei.com/Ascend910-Unhealthy"] == "Ascend910-2"
    assert json.loads(out["huawei.com/Ascend910-Fault"])[0]["fault_code"] == "80E18008"
    await create_cm(api, "kube-system", "mindx-dl-deviceinfo-node-1", device_info_cm(dl, check="1" * 64))
    await eventually(lambda: rejected(kcd, "bad_checkcode") >= 1, what="bad device CheckCode counted")
    assert kcd.center.faults("node-1") == []


async def test_public_fault_config_map_goes_through_pubfault_validation(k8s, kcd):
    emu, api = k8s
    now = int(time.time() * 1000)
    req = {
        "id": "cm-fault-0001",
        "timestamp": now,
        "version": "1.0",
        "resource": "CCAE",
        "faults": [
            {
                "faultId": "fault-0001",
                "faultType": "NPU",
                "faultCode": "220001001",
                "faultTime": now,
                "assertion": "occur",
                "influence": [{"nodeName": "node-1", "deviceIds": [0, 1]}],
                "description": "from a configmap",
            }
        ],
    }
    await create_cm(
        api,
        "default",
        "my-public-fault",
        {"PublicFault": json.dumps(req)},
        labels={"mc-consumer-publicfault": "true"},
    )
    f = await eventually(
        lambda: [x for x in kcd.center.faults("node-1") if x.source.startswith("public:")], what="public"
    )
    assert sorted((x.device_id, x.code, x.level) for x in f) == [
        (0, "220001001", "SeparateNPU"),
        (1, "220001001", "SeparateNPU"),
    ]
    bad = dict(req, version="2.0", id="cm-fault-0002")
    await create_cm(
        api,
        "default",
        "bad-public-fault",
        {"PublicFault": json.dumps(bad)},
        labels={"mc-consumer-publicfault": "true"},
    )
    await eventually(lambda: rejected(kcd, "publicfault_409") >= 1, what="409 counted")


async def test_isolated_node_is_annotated_and_cleared_on_recovery(k8s, kcd):
    emu, api = k8s
    fault = Fault("deviced", "node-1", "NPU", 0, "80E01801", "SeparateNPU")
    await kcd.center.upsert(fault, origin="deviced")

    async def annotation():
        node = await api._call("get node", api.core.read_node, "node-1")
        return (node["metadata"].get("annotations") or {}).get("NodeHealthyStatus")

    assert await eventually(annotation, what="annotation") == "UnHealthy"
    assert kcd.registry.get_sample_value("faultmesh_node_unhealthy", {"node": "node-1"}) == 1
    await kcd.center.remove(fault.key)
    await eventually(lambda: _none(annotation), what="annotation removed")
    assert kcd.registry.get_sample_value("faultmesh_node_unhealthy", {"node": "node-1"}) is None


async def _is_empty(coro):
    return (await coro) == {}


async def _none(coro_fn):
    return (await coro_fn()) is None


async def test_api_errors_500_and_409_are_retried_with_backoff(k8s, tmp_path):
    emu, api = k8s
    # before clusterd starts: kmock counts its [:n] over every matching request since its own start
    emu[kmock.action.UPDATE, kmock.resource("v1/configmaps")][:3] << 500
    emu[kmock.action.CREATE, kmock.resource("v1/configmaps")][:1] << 409
    kcd = await start_kcd(api, tmp_path)
    try:
        await _retried(api, kcd)
    finally:
        await kcd.stop()


async def _retried(api, kcd) -> None:
    await kcd.center.upsert(Fault("deviced", "node-2", "NPU", 4, "80E18008", "RestartNPU"), origin="deviced")

    async def with_fault():  # the start-up publish already lists node-2 (no faults): wait for the fault
        dev = await published(api, "cluster-info-device-0")
        return dev if dev and "80E18008" in json.dumps(dev.get("mindx-dl-deviceinfo-node-2")) else None

    dev = await eventually(with_fault, what="the fault in the device shard despite errors")
    assert "mindx-dl-deviceinfo-node-2" in dev
    errors = kcd.registry.get_sample_value(
        "faultmesh_kube_writes_total", {"kind": "configmap", "result": "error"}
    )
    assert errors and errors >= 1
    samples = {
        tuple(sorted(s.labels.items())): s.value
        for m in kcd.registry.collect()
        if m.name == "faultmesh_kube_api_errors"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert sum(v for k, v in samples.items() if ("status", "500") in k) >= 1, samples


async def start_kcd(api, tmp_path):
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    return await kube_clusterd(tmp_path, api.url)


def restarts(cd, watch: str, why: str) -> float:
    return (
        cd.registry.get_sample_value("faultmesh_kube_watch_restarts_total", {"watch": watch, "why": why}) or 0
    )


NODE_FAULT = {
    "FaultDevList": [
        {"DeviceType": "Disk", "DeviceId": 2, "FaultCode": ["2C000031"], "FaultLevel": "SeparateFault"}
    ],
    "NodeStatus": "UnHealthy",
}
FAN_FAULT = {
    "FaultDevList": [
        {"DeviceType": "Fan", "DeviceId": 1, "FaultCode": ["0D000001"], "FaultLevel": "PreSeparateFault"}
    ],
    "NodeStatus": "PreSeparate",
}


async def test_expired_watch_is_relisted_without_losing_events(k8s, tmp_path):
    emu, api = k8s
    await create_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-2", node_info_cm(NODE_FAULT))
    gone = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }
    # Every configmap watch (7: nodeinfo, deviceinfo, publicfault, clusterd-config-cm, the control
    # ConfigMaps slownode and datatrace, and slow network's pingmesh) first gets "410 Gone" (its
    # resourceVersion expired). The first 20 watches get it: a watch that relists early may take a
    # second one before the last watch started (12 left slownode/datatrace without one once the
    # data-trace and super-pod writers joined: failed in make test)
    emu[kmock.action.WATCH, kmock.resource("v1/configmaps")][:20] << (gone,)
    cd = await start_kcd(api, tmp_path)
    try:
        for w in ("nodeinfo", "deviceinfo", "publicfault"):
            await eventually(lambda w=w: restarts(cd, w, "expired") >= 1, what=f"{w} relisted after 410")
        await eventually(
            lambda: restarts(cd, "slownode", "expired") + restarts(cd, "datatrace", "expired") >= 2
        )
        # Present before the expiry and created after it: both consumed.
        await eventually(
            lambda: [f for f in cd.center.faults("node-2") if f.source == "kube:nodeinfo"], what="listed"
        )
        await create_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-1", node_info_cm(FAN_FAULT))
        await eventually(
            lambda: [f for f in cd.center.faults("node-1") if f.code == "0D000001"], what="watched"
        )
    finally:
        await cd.stop()


async def test_dropped_watches_and_failing_lists_recover(k8s, tmp_path):
    emu, api = k8s
    # The API server fails the first lists with 500 and then drops the first watches at once (one
    # of each per configmap watcher: nodeinfo, deviceinfo, publicfault, clusterd-config-cm,
    # slownode, datatrace, and slownet's pingmesh ConfigMaps).
    emu[kmock.action.LIST, kmock.resource("v1/configmaps")][:7] << 500
    emu[kmock.action.WATCH, kmock.resource("v1/configmaps")][:7] << b""
    emu[kmock.action.LIST, kmock.resource("v1/nodes")][:1] << 503
    cd = await start_kcd(api, tmp_path)
    try:
        watches = (
            "nodeinfo",
            "deviceinfo",
            "publicfault",
            "clusterdconfig",
            "slownode",
            "datatrace",
            "pingmesh",
        )
        await eventually(
            lambda: sum(restarts(cd, w, "ended") for w in watches) >= 7, what="dropped watches resumed"
        )
        await eventually(
            lambda: sum(restarts(cd, w, "error") for w in watches) >= 2, what="failed lists retried"
        )
        assert restarts(cd, "nodes", "error") >= 1
        await create_cm(api, "mindx-dl", "mindx-dl-nodeinfo-node-1", node_info_cm(FAN_FAULT))
        await eventually(
            lambda: [f for f in cd.center.faults("node-1") if f.code == "0D000001"], what="fault after errors"
        )
    finally:
        await cd.stop()


async def test_jobs_are_discovered_from_pods(k8s, kcd):
    emu, api = k8s
    pods = [
        job_pod("llama-worker-1", "node-2", 1, [4, 5], **{"recover-strategy": "recover,dump"}),
        job_pod("llama-worker-0", "node-1", 0, [0, 1]),
    ]
    for p in pods:
        await api._call("create pod", api.core.create_namespaced_pod, "train", p)

    def full_job():
        job = kcd.jobs.get("uid-job-1")
        return job if job is not None and len(job.ranks) == 4 else None

    job = await eventually(full_job, what="job with both pods")
    assert (job.namespace, job.name, job.status) == ("train", "llama", "running")
    assert [(r.rank, r.node, r.device_id) for r in job.ranks] == [
        (0, "node-1", 0),
        (1, "node-1", 1),
        (2, "node-2", 4),
        (3, "node-2", 5),
    ]
    assert "recover" in job.strategies()
    # A pod with a broken annotation is rejected and counted; the job keeps its last good view.
    bad = job_pod("other-0", "node-1", 0, [0], uid="uid-job-2", job="other")
    bad["metadata"]["annotations"]["hccl/rankIndex"] = "zero"
    await api._call("create pod", api.core.create_namespaced_pod, "train", bad)
    await eventually(lambda: rejected(kcd, "bad_job_pods") >= 1, what="bad pod counted")
    assert kcd.jobs.get("uid-job-2") is None
    # All pods gone -> the job is removed from the registry.
    for p in pods:
        await api._call("delete pod", api.core.delete_namespaced_pod, p["metadata"]["name"], "train")
    await eventually(lambda: kcd.jobs.get("uid-job-1") is None, what="job removed")


async def test_missing_cluster_config_fails_start_with_a_clear_error(tmp_path):
    from support import free_port

    from clusterd.app import ClusterD, _load_component_classes, build_parser

    classes = _load_component_classes()
    args = build_parser(classes).parse_args(
        [
            "--grpc-addr",
            f"127.0.0.1:{free_port()}",
            "--http-addr",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            str(tmp_path / "state"),
            "--kube",
            "--kubeconfig",
            str(tmp_path / "no-such-kubeconfig"),
        ]
    )
    cd = ClusterD(args, classes)
    try:
        with pytest.raises(OSError, match="--kube: cannot load the Kubernetes client configuration"):
            await cd.start()
    finally:
        await cd.stop()


async def test_restart_does_not_rewrite_unchanged_cluster_info(k8s, tmp_path):
    emu, api = k8s
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    args = ("--kube", "--kube-api", api.url, "--kube-min-write-s", "0.02", "--kube-timeout-s", "2")
    cd = await make_clusterd(tmp_path, *args)
    try:
        await cd.center.upsert(
            Fault("deviced", "node-1", "NPU", 1, "80E18008", "RestartNPU"), origin="deviced"
        )
        await cd.center.upsert(
            Fault("noded", "node-2", "CPU", 0, "00000001", "SeparateFault"), origin="noded"
        )
        first = await eventually(lambda: published(api, "cluster-info-node-cm"), what="first publication")
        dev = await eventually(lambda: published(api, "cluster-info-device-0"), what="device shard")
    finally:
        await cd.stop()
    await asyncio.sleep(1.1)  # a rewrite would now carry a newer UpdateTime
    cd2 = await make_clusterd(tmp_path, *args)  # same state dir: the faults come back from SQLite
    try:
        comp = kube(cd2)
        await eventually(
            lambda: comp.publisher._written and not comp.publisher._dirty.is_set(),
            what="second clusterd settled",
        )
        await asyncio.sleep(0.5)
        ok = cd2.registry.get_sample_value(
            "faultmesh_kube_writes_total", {"kind": "configmap", "result": "ok"}
        )
        assert not ok, f"{ok} ConfigMaps rewritten although nothing changed"
        assert await published(api, "cluster-info-node-cm") == first
        assert await published(api, "cluster-info-device-0") == dev
    finally:
        await cd2.stop()


def test_switch_entry_keeps_reference_switch_info_and_adds_own_faults():
    from clusterd.kube import cluster_info

    base = {
        "FaultCode": ['{"EventType":1}'],
        "FaultLevel": "SubHealthFault",
        "NodeStatus": "SubHealthy",
        "FaultTimeAndLevelMap": {"x_1_2": {"fault_time": 5, "fault_level": "SubHealthFault"}},
    }
    own = Fault("deviced", "n", "Switch", 3, "[0x08520003,na,L2,na]", "SeparateNPU", first_seen_ms=7)
    e = cluster_info.build_switch_entry("n", [own], base)
    assert e["CmName"] == "mindx-dl-switchinfo-n"
    # a fault without deviced's per-port records: one record made from the fault (chip 3, port 0)
    assert e["FaultCode"][0] == '{"EventType":1}' and len(e["FaultCode"]) == 2
    rec = json.loads(e["FaultCode"][1])
    assert (rec["AssembledFaultCode"], rec["SwitchChipId"], rec["Assertion"], rec["AlarmRaisedTime"]) == (
        "[0x08520003,na,L2,na]",
        3,
        1,
        7,
    )
    assert e["FaultLevel"] == "SeparateNPU" and e["NodeStatus"] == "UnHealthy"
    assert set(e["FaultTimeAndLevelMap"]) == {"x_1_2", "[0x08520003,na,L2,na]_3_0"}
    assert cluster_info.build_switch_entry("n", [], base)["NodeStatus"] == "SubHealthy"


async def test_clusterd_config_cm_sets_the_manual_separation_policy_live(k8s, kcd):
    """clusterd-config-cm (reference clusterd.md §8): a change takes effect without restart; a bad
    policy is rejected (counted) and the last good one stays."""
    from clusterd.separation import Policy

    emu, api = k8s
    assert kcd.separation.policy == Policy()
    key = "manually_separate_policy.conf"
    policy = "enabled: true\nseparate: {fault_window_hours: 2, fault_threshold: 5}\nrelease: {fault_free_hours: -1}\n"
    await create_cm(api, "cluster-system", "clusterd-config-cm", {key: policy}, labels={})
    await eventually(
        lambda: kcd.separation.policy == Policy(True, 2, 5, -1), what="policy from the ConfigMap"
    )
    await api.patch_config_map(
        "cluster-system", "clusterd-config-cm", {"data": {key: "separate: {fault_window_hours: 0}\n"}}
    )

    def rejected_policies():
        labels = {"file": "clusterd-config-cm"}
        return kcd.registry.get_sample_value("faultmesh_config_rejected_total", labels) or 0

    await eventually(lambda: rejected_policies() == 1, what="bad policy rejected")
    assert kcd.separation.policy == Policy(True, 2, 5, -1)


async def test_publish_holdoff_keeps_the_published_view_until_it_ends(k8s, tmp_path):
    """A new leader (HA) starts without the agents' faults: during the hold-off the cluster-info
    ConfigMaps on the server stay as the last leader wrote them (a new fault is not published yet)."""
    from clusterd.kube.publisher import publish_holdoff_s

    emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, "--kube-publish-holdoff-s", "3600")
    try:
        await cd.center.upsert(
            Fault("deviced", "node-1", "NPU", 2, "80E18008", "RestartNPU"), origin="deviced"
        )
        await eventually(lambda: kube(cd).publisher.held, what="hold-off")
        assert await published(api, "cluster-info-device-0") is None  # nothing written while held
    finally:
        await cd.stop()
    assert publish_holdoff_s(-1.0, leader_elect=True) == 15.0  # --kube-leader-elect on
    assert publish_holdoff_s(-1.0, leader_elect=False) == 0.0
