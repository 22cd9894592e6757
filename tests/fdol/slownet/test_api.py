"""fdol.slownet's own dataclasses in and out (issue 12: a pure library, no protobuf, no codes)."""

from __future__ import annotations

import pytest

from fdol.slownet import csvfile, pinglist, topology
from fdol.slownet import localize as loc
from fdol.slownet.analyzer import AnalyzerParams, SlowNetDetection, SuperPodAnalyzer
from fdol.slownet.topology import NodeTopology, TopologyError
from fdol.slownet.window import PingRow

P = 10_000


def test_ping_record_csv_round_trip_and_row(tmp_path):
    rec = csvfile.PingRecord(1, "0", "6094863", "0", "4194304", -1, -1, -1, 1.0, 1.0, 1.0, 1755687818727)
    assert csvfile.csv_line(rec) == "1,0,6094863,0,4194304,-1,-1,-1,1.000,1.000,1.000,1755687818727"
    p = tmp_path / "ping_result_1.csv"
    p.write_text(csvfile.CSV_HEADER + "\n" + csvfile.csv_line(rec) + "\n")
    rows, bad = csvfile.read_csv_rows(p)
    assert (rows, bad) == ([rec], 0)
    assert rec.row() == PingRow(1, "0", "6094863", "0", "4194304", -1, -1, -1, 1.0, 1755687818727)
    assert csvfile.read_csv_rows(tmp_path / "missing.csv") == ([], 0)


def test_from_nodes_validates_like_the_json_parser():
    nodes = [
        NodeTopology("a", 1, {0: topology.make_sdid(1, 0)}),
        NodeTopology("b", 2, {0: topology.make_sdid(2, 0)}),
    ]
    sp = topology.from_nodes("5", nodes)
    assert sp.super_pod_id == "5" and sp.locate(topology.make_sdid(2, 0)) == ("b", 0)
    for bad, why in [
        (("", nodes), "super_pod_id"),
        (("0", [NodeTopology("", 1, {0: 1})]), "without a name"),
        (("0", [nodes[0], nodes[0]]), "twice"),
        (("0", [NodeTopology("a", 1, {0: -1})]), "out of range"),
        (("0", [NodeTopology("a", 1, {})]), "empty DeviceMap"),
        (("x", nodes), "integer"),
    ]:
        with pytest.raises(TopologyError, match=why):
            topology.from_nodes(*bad)


def test_node_ping_list_groups_by_source_and_dedups():
    sp = topology.build_super_pod(0, ["a", "b"], npus_per_node=2)
    mine = pinglist.by_node(pinglist.generate(sp))["a"]
    lst = pinglist.node_ping_list("0", mine + mine[:1])
    assert lst.uid != pinglist.node_ping_list("0", mine).uid  # the uid covers every pair given
    assert {phy: len(d) for phy, d in lst.tasks.items()} == {0: 2, 1: 2}
    assert all(list(d) == sorted(d, key=int) for d in lst.tasks.values())
    assert pinglist.node_ping_list("0", []).tasks == {}


def test_alarm_names_a_scope_not_a_code():
    sp = topology.build_super_pod(0, ["a", "b"], npus_per_node=2)
    ev = [
        loc.PathEvidence(p.src_node, p.src_phy, p.src_sdid, p.dst_node, p.dst_phy, p.dst_sdid, p.task_id,
                         100.0 if p.src_phy == 1 and p.src_node == "a" and p.dst_node == "b" else 0.0, 5.0,
                         p.src_phy == 1 and p.src_node == "a" and p.dst_node == "b", False)
        for p in pinglist.generate(sp)
    ]  # fmt: skip
    (a,) = loc.localize(ev, sp)
    d = a.to_dict()
    assert a.kind == "link" and a.scope == loc.SCOPE_BETWEEN_NODES == d["scope"] and "code" not in d
    assert set(loc.SCOPES) == {"inside_node", "between_nodes", "not_converged", "card_unreachable"}


def _rows(sp, pairs, k, bad):
    return [
        PingRow(p.task_id, "0", str(p.src_sdid), "0", str(p.dst_sdid), 4, 6, 5,
                0.5 if bad(p) else 0.0, k * P + 100)
        for p in pairs
    ]  # fmt: skip


def test_detections_of_a_degraded_plane_one_per_node_and_filtered():
    sp = topology.build_super_pod(0, ["n0", "n1", "n2"], npus_per_node=4, planes=2)
    pairs = pinglist.generate(sp)
    an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P))
    in_plane = lambda p: p.src_node != p.dst_node and 1 in (sp.plane_of(p.src_phy), sp.plane_of(p.dst_phy))  # noqa: E731
    for k in range(10):
        an.ingest(_rows(sp, pairs, k, in_plane if k == 9 else lambda p: False))
        an.analyze(k)
    found = an.detections()
    assert [(d.node, d.device_type, d.device_id, d.scope) for d in found] == [
        (n, "Plane", 1, "not_converged") for n in ("n0", "n1", "n2")
    ]
    d = found[0]
    assert isinstance(d, SlowNetDetection) and d.key == ("n0", "Plane", 1, "not_converged")
    assert d.fault_types == ("loss",) and d.alarms[0]["kind"] == "plane" and d.first_ms == d.last_ms == 10 * P
    assert d.description == "switch plane 1 degraded" and d.super_pod_id == "0"
    assert [x.node for x in an.detections(node_filter={"n1"})] == ["n1"]


def test_strict_json_refuses_what_is_not_json():
    from fdol import strictjson

    assert strictjson.loads(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    assert strictjson.dumps({"a": "é", "b": [1]}) == '{"a":"é","b":[1]}'.encode()
    for bad in (b"NaN", b'{"a": Infinity}', b"\xff", b"[" * 100_000, b"{", b""):
        with pytest.raises(ValueError):
            strictjson.loads(bad)
    with pytest.raises(TopologyError, match="not JSON"):
        topology.parse_super_pod(b"[" * 100_000)
