"""The RoCE parameter plane between super pods (issue 16; reference fdol.md §8.1-§8.2, §8.7):
endpoint choice, ping lists, localization of an endpoint, a link, a super pod's uplink, the switch."""

from __future__ import annotations

import pytest

from fdol.slownet import config, roce
from fdol.slownet import topology as topo
from fdol.slownet.analyzer import AnalyzerParams, SuperPodAnalyzer
from fdol.slownet.window import PingRow

P = 10_000


def pods(n_pods=4, nodes=6, with_ip=None):
    out = []
    for s in range(n_pods):
        sp = topo.build_super_pod(s + 1, [f"sp{s + 1}-n{i}" for i in range(nodes)], npus_per_node=8)
        for i, n in enumerate(sorted(sp.nodes.values(), key=lambda n: n.server_index)):
            if with_ip is None or i < with_ip:
                n.roce_ip = f"10.{s + 1}.0.{i + 1}"
        out.append(sp)
    return out


def test_topology_carries_the_roce_ip_and_rejects_bad_ones():
    sp = pods(1)[0]
    back = topo.parse_super_pod(sp.to_json_obj())
    assert {n.name: n.roce_ip for n in back.nodes.values()} == {n.name: n.roce_ip for n in sp.nodes.values()}
    obj = sp.to_json_obj()
    obj["NodeDeviceMap"]["sp1-n0"]["RoceIP"] = "10.1.0.300"
    with pytest.raises(topo.TopologyError, match="IPv4"):
        topo.parse_super_pod(obj)
    obj["NodeDeviceMap"]["sp1-n0"].update(RoceIP="10.1.0.9", RocePhyId="12")
    with pytest.raises(topo.TopologyError, match="RocePhyId"):
        topo.parse_super_pod(obj)


def test_plane_picks_five_per_pod_and_probes_every_pod_pair():
    plane = roce.build_plane(pods(4, nodes=8))
    assert {s: len(v) for s, v in plane.pods.items()} == {"1": 5, "2": 5, "3": 5, "4": 5}
    assert [e.server_index for e in plane.pods["1"]] == [1, 3, 5, 6, 8]  # spread evenly
    assert plane.super_pod_list() == {"superPodList": [1, 2, 3, 4]}
    pairs = plane.pairs()
    probed = {(plane.by_sdid[p.src_sdid].super_pod_id, plane.by_sdid[p.dst_sdid].super_pod_id) for p in pairs}
    assert probed == {(a, b) for a in "1234" for b in "1234" if a != b}
    lst = plane.node_ping_list(plane.pods["1"][0].node)
    assert list(lst) == [0] and sorted(lst[0]) == ["10.2.0.1", "10.3.0.1", "10.4.0.1"]
    body = plane.reference_ping_list(plane.pods["1"][0].node)
    assert body[0]["pingList"][0]["srcAddr"] == "10.1.0.1" and body[0]["pingList"][0]["dstType"] == 0
    many = roce.build_plane(pods(20, nodes=5))  # 19 peers > 16: offsets split over the 5 endpoints
    per_src: dict = {}
    for p in many.pairs():
        per_src.setdefault(p.src_sdid, []).append(p)
    assert max(len(v) for v in per_src.values()) <= roce.MAX_DESTS
    probed = {
        (many.by_sdid[p.src_sdid].super_pod_id, many.by_sdid[p.dst_sdid].super_pod_id) for p in many.pairs()
    }
    assert len(probed) == 20 * 19


def test_plane_needs_two_pods_with_five_roce_nodes_and_distinct_ips():
    with pytest.raises(roce.RoceError, match="2 super pods"):
        roce.build_plane(pods(3, nodes=6, with_ip=4))
    sps = pods(2)
    sps[1].nodes["sp2-n0"].roce_ip = "10.1.0.1"
    with pytest.raises(roce.RoceError, match="both"):
        roce.build_plane(sps)
    assert config.for_super_pod(config.parse_config({"roce": {"activate": "on", "task_interval": 2}}), "roce")


def run(plane, bad, periods=14, start_bad=10, loss=1.0):
    pairs = plane.pairs()
    an = SuperPodAnalyzer(plane.sp, pairs, AnalyzerParams(period_ms=P))
    ip = {e.sdid: e.ip for v in plane.pods.values() for e in v}
    for k in range(periods):
        rows = [
            plane.to_plane_row(PingRow(0, "0", ip[p.src_sdid], "0", ip[p.dst_sdid], 20, 30, 25,
                                       loss if k >= start_bad and bad(plane, p) else 0.0, k * P + 100))
            for p in pairs
        ]  # fmt: skip
        assert an.ingest(rows)["accepted"] == len(rows)
        rep = an.analyze(k)
        if k == start_bad:
            return rep.alarms, an


def sp_of(plane, sdid):
    return plane.by_sdid[sdid].super_pod_id


def test_localizes_an_endpoint_a_super_pod_and_the_switch():
    plane = roce.build_plane(pods(4))
    dead = plane.pods["2"][1]
    alarms, an = run(plane, lambda pl, p: dead.sdid in (p.src_sdid, p.dst_sdid))
    assert [(a.kind, a.node, a.phy) for a in alarms] == [("npu", dead.node, dead.phy)]
    alarms, an = run(plane, lambda pl, p: "3" in (sp_of(pl, p.src_sdid), sp_of(pl, p.dst_sdid)))
    (a,) = alarms
    assert (a.kind, a.src_id, a.src_type, a.level) == ("superpod", "SuperPod-3", 7, 2)
    assert a.scope == "not_converged"
    found = an.detections()
    assert {(d.node, d.device_type, d.device_id) for d in found} == {
        (e.node, "SuperPod", 3) for e in plane.pods["3"]
    }
    alarms, _ = run(plane, lambda pl, p: True, loss=0.4)
    assert [(a.kind, a.src_type) for a in alarms] == [("switch", 8)]


def test_two_pods_cannot_blame_a_pod_or_the_switch():
    plane = roce.build_plane(pods(2))
    alarms, _ = run(plane, lambda pl, p: sp_of(pl, p.src_sdid) == "2" or sp_of(pl, p.dst_sdid) == "2")
    assert {a.kind for a in alarms} <= {"npu", "node", "link"} and alarms
