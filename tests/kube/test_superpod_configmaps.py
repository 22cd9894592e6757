"""Kubernetes mode, issue 32 item 6: clusterd writes the ``super-pod-<id>`` ConfigMaps the reference's
pingmesh publisher writes (``publisher.go``), from the agents' device states, while pingmesh is on;
the ConfigMap is the one a reference noded reads, and faultmesh's own reader (clusterd's slownet
watch) takes it back as the super pod's topology."""

from __future__ import annotations

import json

import pytest
from support import eventually

from faultmesh.kube import KubeError
from fdol.slownet import topology as topo

NS = "cluster-system"


def kube(cd):
    return next(c for c in cd.components if c.name == "kube")


def slownet(cd):
    return next(c for c in cd.components if c.name == "slownet")


def chips(spid: int, index: int, n: int = 16) -> list[dict]:
    """deviced's device states of one A3 node (the agent stream's node-registry views)."""
    return [
        {"device_type": "Ascend910", "device_id": i, "phy_id": i, "health": "Healthy", "network_health": "Healthy",
         "level": "", "super_pod_id": spid, "server_index": index}
        for i in range(n)
    ]  # fmt: skip


async def cm_or_none(api, name):
    try:
        return await api.get_config_map(NS, name)
    except KubeError as e:
        assert e.status == 404
        return None


def writes(cd, result):
    return (
        cd.registry.get_sample_value("faultmesh_kube_writes_total", {"kind": "superpod", "result": result})
        or 0
    )


@pytest.fixture
async def scd(k8s, tmp_path):
    from kube.kubekit import kube_clusterd

    cd = await kube_clusterd(tmp_path, k8s[1].url, "--kube-superpod-period-s", "0.1")
    yield cd
    await cd.stop()


async def test_super_pod_configmap_as_the_reference_writes_it(k8s, scd):
    _, api = k8s
    scd.nodes.update("node-a", devices=chips(7, 0), owner="deviced")
    scd.nodes.update("node-b", devices=chips(7, 1), owner="deviced")
    scd.nodes.update("node-x", devices=chips(-1, -1, 8), owner="deviced")  # no super pod: not in any map
    sp = kube(scd).superpods
    await eventually(lambda: sp.api is not None, what="kube started")
    assert await sp.publish_once() == 0  # pingmesh off (no pingmesh-config): nothing, as the reference
    assert await cm_or_none(api, "super-pod-7") is None
    await api.create_config_map(NS, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "pingmesh-config", "namespace": NS, "labels": {"app": "pingmesh"}},
        "data": {"global": json.dumps({"activate": "on", "task_interval": 1})},
    })  # fmt: skip
    obj = await eventually(lambda: cm_or_none(api, "super-pod-7"), what="super-pod-7 written")
    assert obj["metadata"]["labels"]["app"] == "pingmesh"
    assert set(obj["data"]) == {"superPodDevice"}
    raw = obj["data"]["superPodDevice"]
    doc = json.loads(raw)
    # Go's json.Marshal of SuperPodDevice: compact, fields in declaration order, map keys as strings sorted
    assert raw == json.dumps(doc, separators=(",", ":"))
    assert list(doc) == ["Version", "SuperPodID", "NodeDeviceMap"]
    assert doc["Version"] == "A3" and doc["SuperPodID"] == "7"
    assert list(doc["NodeDeviceMap"]) == ["node-a", "node-b"]
    b = doc["NodeDeviceMap"]["node-b"]
    assert list(b) == ["NodeName", "ServerID", "DeviceMap"]
    assert b["NodeName"] == "node-b" and b["ServerID"] == "1"
    assert list(b["DeviceMap"])[:4] == ["0", "1", "10", "11"]  # Go sorts map keys as strings
    assert b["DeviceMap"]["15"] == "6094863"  # the reference docs' SDID of server 1, phy 15
    assert doc["NodeDeviceMap"]["node-a"]["DeviceMap"]["0"] == "0"
    # faultmesh's own reader: the topology parser, and clusterd's slownet watch on the ConfigMap
    parsed = topo.parse_super_pod(raw)
    assert parsed.super_pod_id == "7" and parsed.nodes["node-b"].server_index == 1
    assert parsed.locate(6094863) == ("node-b", 15)
    sn = slownet(scd)
    await eventually(lambda: "7" in sn.pods, what="slownet took the topology")
    assert set(sn.pods["7"].sp.nodes) == {"node-a", "node-b"} and sn.pods["7"].sp.npu_count == 32
    assert writes(scd, "ok") == 1
    # unchanged: no new write (the reference's check code)
    assert await sp.publish_once() == 0 and writes(scd, "ok") == 1
    # a node leaves the super pod: the map is rewritten without it; the last one: deleted
    scd.nodes.update("node-b", devices=[], owner="deviced", replace=True)
    await eventually(lambda: _nodes_of(api, "super-pod-7", ["node-a"]), what="super-pod-7 without node-b")
    scd.nodes.update("node-a", devices=[], owner="deviced", replace=True)
    await eventually(lambda: _gone(api, "super-pod-7"), what="super-pod-7 deleted")
    assert writes(scd, "deleted") == 1


async def _nodes_of(api, name, nodes):
    obj = await cm_or_none(api, name)
    return obj is not None and list(json.loads(obj["data"]["superPodDevice"])["NodeDeviceMap"]) == nodes


async def _gone(api, name):
    return await cm_or_none(api, name) is None


async def test_foreign_map_left_alone_and_failed_write_retried(k8s, scd):
    _, api = k8s
    sp = kube(scd).superpods
    await eventually(lambda: sp.api is not None, what="kube started")
    sp.pingmesh_on = lambda: True
    theirs = topo.build_super_pod(3, ["node-p"], npus_per_node=4).to_json_obj()
    await api.create_config_map(NS, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "super-pod-3", "namespace": NS, "labels": {"app": "pingmesh"}},
        "data": {"superPodDevice": json.dumps(theirs)},
    })  # fmt: skip
    real = sp.api

    class Failing:
        async def get_config_map(self, ns, name):
            return await real.get_config_map(ns, name)

        async def upsert_config_map(self, *a):
            raise KubeError("patch configmap", 500, "boom")

    sp.api = Failing()
    scd.nodes.update("node-q", devices=chips(4, 0, 4), owner="deviced")
    scd.nodes.update("node-p", devices=chips(3, 0, 4), owner="deviced")
    with pytest.raises(KubeError):
        await sp.publish_once()
    assert writes(scd, "error") >= 1 and "super-pod-4" not in sp.written
    sp.api = real
    await eventually(lambda: cm_or_none(api, "super-pod-4"), what="super-pod-4 written after the failure")
    await eventually(lambda: writes(scd, "foreign") == 1, what="foreign map counted")
    obj = await api.get_config_map(NS, "super-pod-3")
    assert json.loads(obj["data"]["superPodDevice"]) == theirs  # an operator's topology stays as it is


async def test_node_annotations_of_the_reference_device_plugin_give_the_real_sdids(k8s, scd):
    _, api = k8s
    sp = kube(scd).superpods
    await eventually(lambda: sp.api is not None, what="kube started")
    sp.pingmesh_on = lambda: True
    infos = {
        "Ascend910-0": {"IP": "10.0.0.1", "SuperDeviceID": 111},
        "Ascend910-1": {"IP": "", "SuperDeviceID": 222},
    }
    await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "node-r", "labels": {"huawei.com/topotree.superpodid": "5"},
        "annotations": {"serverIndex": "2", "baseDeviceInfos": json.dumps(infos)},
    }})  # fmt: skip
    scd.nodes.update("node-r", devices=chips(9, 0, 2), owner="deviced")  # the annotations win
    bad = {"Ascend910-x": {"SuperDeviceID": 1}}  # not Ascend910-<int>: the node's annotations are unusable
    await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "node-s", "annotations": {"superPodID": "5", "serverIndex": "3", "baseDeviceInfos": json.dumps(bad)},
    }})  # fmt: skip
    obj = await eventually(lambda: cm_or_none(api, "super-pod-5"), what="super-pod-5 from the annotations")
    doc = json.loads(obj["data"]["superPodDevice"])
    assert doc["NodeDeviceMap"] == {
        "node-r": {"NodeName": "node-r", "ServerID": "2", "DeviceMap": {"0": "111", "1": "222"}}
    }
    assert await cm_or_none(api, "super-pod-9") is None


async def test_only_the_leader_writes_and_a_new_leader_takes_over_the_maps(k8s, tmp_path):
    from kube.kubekit import kube_clusterd

    _, api = k8s
    elect = (
        "--kube-leader-elect",
        "on",
        "--kube-lease-namespace",
        "faultmesh",
        "--kube-superpod-period-s",
        "0.1",
    )
    cd1 = await kube_clusterd(tmp_path / "a", api.url, *elect)
    cd2 = None
    try:
        await eventually(lambda: kube(cd1).elector.leading.is_set(), what="first replica leads")
        cd2 = await kube_clusterd(tmp_path / "b", api.url, *elect)
        rounds = {1: 0, 2: 0}  # publish rounds per replica (each asks whether pingmesh is on)

        def on(i):
            def f():
                rounds[i] += 1
                return True

            return f

        for i, cd, spid in ((1, cd1, 7), (2, cd2, 6)):
            kube(cd).superpods.pingmesh_on = on(i)
            cd.nodes.update(f"node-{spid}", devices=chips(spid, 0, 2), owner="deviced")
        await eventually(lambda: cm_or_none(api, "super-pod-7"), what="the leader writes")
        await eventually(lambda: rounds[1] >= 5, what="more leader rounds")
        assert not kube(cd2).elector.leading.is_set() and writes(cd1, "ok") == 1
        assert rounds[2] == 0 and await cm_or_none(api, "super-pod-6") is None  # the follower ran no round
        await cd1.stop()
        cd1 = None
        await eventually(lambda: kube(cd2).elector.leading.is_set(), timeout_s=20, what="follower leads")
        # the new leader reads back the maps the old one wrote: super-pod-7 has no node here any more
        await eventually(lambda: cm_or_none(api, "super-pod-6"), what="the new leader writes")
        await eventually(lambda: _gone(api, "super-pod-7"), what="the old leader's map of a gone super pod")
    finally:
        for cd in (cd1, cd2):
            if cd is not None:
                await cd.stop()
