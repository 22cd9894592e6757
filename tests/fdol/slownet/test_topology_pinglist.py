"""Topology parsing and ping-list coverage (issue 6 "Done when": every NPU probed, every node pair probed)."""

from __future__ import annotations

import itertools
import json

import pytest

from fdol.slownet import pinglist, topology
from fdol.slownet.topology import TopologyError

# Two servers of the documented super-pod-0 example (reference docs, superPodDevice).
DOC_SERVER_15 = {
    "0": "62914560", "1": "62980097", "2": "63176706", "3": "63242243", "10": "64225290", "15": "64815119",
}  # fmt: skip
DOC_SERVER_1 = {"0": "4194304", "1": "4259841", "7": "5046279", "15": "6094863"}


def test_sdid_to_ip_matches_reference_examples():
    assert topology.sdid_to_ip(62914560) == "192.15.2.199"
    assert topology.sdid_to_ip(62980097) == "192.15.3.198"
    assert topology.sdid_to_ip(4259841) == "192.1.3.198"


def test_make_sdid_reproduces_documented_device_maps():
    for server, dm in ((15, DOC_SERVER_15), (1, DOC_SERVER_1)):
        for phy, sdid in dm.items():
            assert topology.make_sdid(server, int(phy)) == int(sdid)
            assert topology.sdid_server_id(int(sdid)) == server
    with pytest.raises(ValueError):
        topology.make_sdid(1024, 0)


def _doc_json():
    return {
        "SuperPodID": "0",
        "NodeDeviceMap": {
            "node-a": {"NodeName": "node-a", "DeviceMap": dict(DOC_SERVER_15)},
            "node-b": {"NodeName": "node-b", "ServerID": "1", "DeviceMap": dict(DOC_SERVER_1)},
        },
    }


def test_parse_reference_super_pod_json():
    sp = topology.parse_super_pod(json.dumps(_doc_json()))
    assert sp.super_pod_id == "0"
    assert sp.nodes["node-a"].server_index == 15  # derived from the SDIDs when ServerID is absent
    assert sp.nodes["node-b"].server_index == 1
    assert sp.locate(6094863) == ("node-b", 15)
    assert sp.locate(12345) is None
    assert sp.npu_count == 10
    # the ConfigMap data wrapper is accepted too
    wrapped = {"superPodDevice": json.dumps(_doc_json())}
    assert topology.parse_super_pod(wrapped).nodes.keys() == sp.nodes.keys()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("SuperPodID"), "SuperPodID"),
        (lambda d: d.update(NodeDeviceMap={}), "NodeDeviceMap"),
        (lambda d: d["NodeDeviceMap"]["node-b"]["DeviceMap"].update({"9": "62914560"}), "SDID 62914560"),
        (lambda d: d["NodeDeviceMap"]["node-b"].update(NodeName="other"), "NodeName"),
        (lambda d: d["NodeDeviceMap"]["node-b"]["DeviceMap"].update({"x": "1"}), "phy id"),
        (lambda d: d["NodeDeviceMap"]["node-b"]["DeviceMap"].update({"99": "1"}), "outside"),
        (lambda d: d["NodeDeviceMap"]["node-b"].update(ServerID="15"), "server index"),
        (lambda d: d.update(Planes={"0": [1, 2], "1": [2]}), "planes"),
    ],
)
def test_contradictory_or_missing_topology_rejected(mutate, message):
    d = _doc_json()
    mutate(d)
    with pytest.raises(TopologyError, match=message):
        topology.parse_super_pod(d)


def test_not_json_rejected():
    with pytest.raises(TopologyError, match="not JSON"):
        topology.parse_super_pod("{nope")


def test_from_nodes_round_trip():
    sp = topology.build_super_pod(3, ["n0", "n1"], npus_per_node=4)
    back = topology.from_nodes(3, sp.nodes.values())
    assert back.super_pod_id == "3"
    assert {n: (t.server_index, t.devices) for n, t in back.nodes.items()} == {
        n: (t.server_index, t.devices) for n, t in sp.nodes.items()
    }
    again = topology.parse_super_pod(json.dumps(sp.to_json_obj()))
    assert again.nodes["n1"].devices == sp.nodes["n1"].devices


def _check_coverage(sp, pairs, max_dests=48):
    all_npus = {(n.name, p) for n in sp.nodes.values() for p in n.devices}
    assert {(p.dst_node, p.dst_phy) for p in pairs} == all_npus, "every NPU is a destination"
    assert {(p.src_node, p.src_phy) for p in pairs} == all_npus, "every NPU probes"
    node_pairs = {(p.src_node, p.dst_node) for p in pairs if p.src_node != p.dst_node}
    assert node_pairs == {(a, b) for a, b in itertools.permutations(sp.nodes, 2)}, "every node pair probed"
    per_task = {}
    for p in pairs:
        per_task.setdefault((p.src_sdid, p.task_id), []).append(p)
        assert (p.task_id == pinglist.TASK_INTRA) == (p.src_node == p.dst_node)
        assert sp.locate(p.src_sdid) == (p.src_node, p.src_phy)
        assert sp.locate(p.dst_sdid) == (p.dst_node, p.dst_phy)
    assert max(len(v) for v in per_task.values()) <= max_dests
    assert len(set(pairs)) == len(pairs)


def test_mesh_list_covers_every_npu_pair_in_node_and_every_node_pair():
    sp = topology.build_super_pod(0, [f"node-{i}" for i in range(4)])
    pairs = pinglist.generate(sp)
    _check_coverage(sp, pairs)
    intra = [p for p in pairs if p.task_id == 0]
    assert len(intra) == 4 * 16 * 15  # full intra-node mesh
    inter = [p for p in pairs if p.task_id == 1]
    assert len(inter) == 4 * 16 * 3 and all(p.src_phy == p.dst_phy for p in inter)


def test_ring_list_rotates_by_two_and_still_covers():
    sp = topology.build_super_pod(0, [f"node-{i}" for i in range(3)])
    pairs = pinglist.generate(sp, intra="ring")
    _check_coverage(sp, pairs)
    n0 = sp.nodes["node-0"]
    ring = {(p.src_phy, p.dst_phy) for p in pairs if p.task_id == 0 and p.src_node == "node-0"}
    order = sorted(n0.devices, key=n0.devices.get)
    assert ring == {(order[i], order[(i + 2) % 16]) for i in range(16)}


def test_large_pod_uses_offsets_and_keeps_every_node_pair():
    sp = topology.build_super_pod(1, [f"n{i}" for i in range(60)], npus_per_node=8)
    pairs = pinglist.generate(sp)
    _check_coverage(sp, pairs)


def test_irregular_nodes_and_single_npu_nodes_are_covered():
    sp = topology.parse_super_pod(_doc_json())
    _check_coverage(sp, pinglist.generate(sp))
    with pytest.raises(pinglist.PingListError):
        pinglist.generate(sp, intra="star")


def test_node_ping_list_and_reference_json_forms():
    sp = topology.build_super_pod(0, ["a", "b"], npus_per_node=4)
    pairs = pinglist.generate(sp)
    mine = pinglist.by_node(pairs)["a"]
    lst = pinglist.node_ping_list("0", mine)
    assert list(lst.tasks) == [0, 1, 2, 3] and lst.super_pod_id == "0"
    assert list(lst.tasks[0]) == [
        str(s) for s in sorted([*(sp.nodes["a"].devices[p] for p in (1, 2, 3)), sp.nodes["b"].devices[0]])
    ]
    assert lst.uid == pinglist.list_uid("0", mine) and len(lst.uid) == 64
    ref = pinglist.to_reference_json(mine)
    assert ref[0]["pingList"][0].keys() == {
        "srcType",
        "dstType",
        "pktSize",
        "srcCardPhyId",
        "srcAddr",
        "dstAddr",
        "dstCardPhyId",
    }
    parsed = pinglist.parse_reference_json(json.dumps(ref))
    assert parsed[0] == list(lst.tasks[0])
    for bad in ("[]", "{}", '[{"pingList": [{"srcCardPhyId": 1}]}]', "nope"):
        with pytest.raises(pinglist.PingListError):
            pinglist.parse_reference_json(bad)
