"""Kubernetes mode, slow network (issue 15): the pingmesh-config and super-pod-<id> ConfigMaps in
cluster-system configure clusterd's pingmesh analysis; bad ones are counted and the last good one
stays; clusterd writes pingmesh-fault-<node> for unreachable cards (occur, then recover once)."""

from __future__ import annotations

import asyncio
import json
import types

import pytest
from support import eventually

from clusterd.kube.leader import Election
from faultmesh.kube import KubeError
from faultmesh.model import Fault
from fdol.slownet import topology as topo

NS = "cluster-system"
LABELS = {"app": "pingmesh", "mx-consumer-cim": "true"}


def slownet(cd):
    return next(c for c in cd.components if c.name == "slownet")


def cm(name, data, labels=LABELS):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "data": data}  # fmt: skip


def rejected(cd):
    return cd.registry.get_sample_value("faultmesh_slownet_inputs_rejected_total", {"kind": "configmap"}) or 0


async def test_configmaps_configure_pingmesh_and_bad_ones_keep_the_last_good(k8s, kcd):
    _, api = k8s
    sn = slownet(kcd)
    good = {
        "global": json.dumps({"activate": "on", "task_interval": 2}),
        "roce": '{"activate":"off","task_interval":1}',
    }
    await api.create_config_map(NS, cm("pingmesh-config", good))
    await eventually(
        lambda: sn.activation("0") and sn.activation("0").task_interval == 2, what="config applied"
    )
    sp = topo.build_super_pod(7, ["node-1", "node-2"], npus_per_node=4)
    await api.create_config_map(NS, cm("super-pod-7", {"superPodDevice": json.dumps(sp.to_json_obj())}))
    await eventually(lambda: "7" in sn.pods, what="topology applied")
    assert set(sn.pods["7"].sp.nodes) == {"node-1", "node-2"}
    # not ours: another label, another name
    await api.create_config_map(NS, cm("pingmesh-config-x", good))
    base = rejected(kcd)
    for i, data in enumerate([
        {"global": '{"activate": "on", "task_interv'},  # truncated JSON
        {"global": json.dumps({"activate": "on", "task_interval": 1}), "bogus": "{}"},  # unknown key
        {"global": json.dumps({"activate": "on", "task_interval": 10**30})},  # huge value
        {"global": "x" * 600_000},  # more than MAX_DATA_BYTES
    ]):  # fmt: skip
        await api.patch_config_map(NS, "pingmesh-config", {"data": data})
        await eventually(lambda i=i: rejected(kcd) >= base + i + 1, what=f"bad config {i} rejected")
    assert sn.activation("0").task_interval == 2  # the last good config stays
    bad_sp = topo.build_super_pod(8, ["node-1"], npus_per_node=4)  # SuperPodID 8 in super-pod-7
    await api.patch_config_map(
        NS, "super-pod-7", {"data": {"superPodDevice": json.dumps(bad_sp.to_json_obj())}}
    )
    await eventually(lambda: rejected(kcd) >= base + 5, what="wrong super pod rejected")
    await api.delete_config_map(NS, "pingmesh-config")  # deletes are ignored, as in the reference
    assert "7" in sn.pods and "8" not in sn.pods and sn.activation("0").task_interval == 2


async def test_pingmesh_fault_configmap_occur_then_recover(k8s, kcd):
    _, api = k8s
    sn = slownet(kcd)
    await eventually(lambda: sn.kube is not None and sn.kube.api is not None, what="kube side started")
    kube, sn.kube = sn.kube, None  # the component's own period must not write between the steps below
    card = Fault("slownet", "node-1", "NPU", 3, "220001001", "SeparateNPU", "occur", 1000, 2000)
    await kube.sync_faults({card.key: card})

    async def doc():
        try:
            obj = await api.get_config_map(NS, "pingmesh-fault-node-1")
        except Exception:
            return None
        assert obj["metadata"]["labels"]["mc-consumer-publicfault"] == "true"
        return json.loads(obj["data"]["PublicFault"])

    d = await doc()
    assert d["resource"] == "pingmesh" and d["version"] == "1.0"
    (f,) = d["faults"]
    assert f["faultCode"] == "220001001" and f["assertion"] == "occur" and f["faultType"] == "NPU"
    assert (
        f["influence"] == [{"nodeName": "node-1", "nodeSN": "", "deviceIds": [3]}] and f["faultTime"] == 1000
    )
    import hashlib

    assert f["faultId"] == hashlib.sha256(b"node-1/3").hexdigest()
    await kube.sync_faults({card.key: card})  # unchanged: no new write
    assert (await doc())["id"] == d["id"]
    await kube.sync_faults({})
    (f,) = (await doc())["faults"]
    assert f["assertion"] == "recover"
    await kube.sync_faults({})
    assert (await doc())["faults"] == []
    # with leader election on, a follower writes nothing; once it leads it writes what it holds
    leading = asyncio.Event()
    kube.election = Election(types.SimpleNamespace(leading=leading))
    other = Fault("slownet", "node-2", "NPU", 5, "220001001", "SeparateNPU", "occur", 3000, 3000)
    await kube.sync_faults({other.key: other})
    with pytest.raises(KubeError):
        await api.get_config_map(NS, "pingmesh-fault-node-2")
    leading.set()
    await kube.sync_faults({other.key: other})
    obj = await api.get_config_map(NS, "pingmesh-fault-node-2")
    assert json.loads(obj["data"]["PublicFault"])["faults"][0]["influence"][0]["deviceIds"] == [5]
    sn.kube = kube  # the component stops its kube side as usual
