"""Localization cases, suppression, alarm lifecycle and recovery (reference fdol.md §8.7, §8.8)."""

from __future__ import annotations

import pytest

from fdol.slownet import localize as loc
from fdol.slownet import pinglist, topology
from fdol.slownet.analyzer import AnalyzerParams, SuperPodAnalyzer
from fdol.slownet.suppress import Suppressor
from fdol.slownet.window import PingRow

NODES = [f"node-{i}" for i in range(4)]


@pytest.fixture
def sp():
    return topology.build_super_pod(0, NODES, planes=4)


def evidence(sp, bad, loss=100.0, delay_fault=False, skip_src_node=None):
    """Evidence for every ping-list path; ``bad(pair)`` marks a path faulty."""
    out = []
    for p in pinglist.generate(sp):
        if p.src_node == skip_src_node:
            continue
        b = bad(p)
        out.append(
            loc.PathEvidence(
                p.src_node, p.src_phy, p.src_sdid, p.dst_node, p.dst_phy, p.dst_sdid, p.task_id,
                loss if b and not delay_fault else 0.0, 50.0 if b and delay_fault else 5.0,
                b and not delay_fault, b and delay_fault,
            )
        )  # fmt: skip
    return out


def test_no_faulty_path_no_alarm(sp):
    assert loc.localize(evidence(sp, lambda p: False), sp) == []


def test_dead_npu_is_localized_to_the_npu(sp):
    def dead(p):
        return (p.src_node, p.src_phy) == ("node-1", 5) or (p.dst_node, p.dst_phy) == ("node-1", 5)

    ev = evidence(sp, dead)
    alarms = loc.localize(ev, sp)
    assert [(a.kind, a.node, a.phy) for a in alarms] == [("npu", "node-1", 5)]
    a = alarms[0]
    assert a.fault_type == loc.FT_DISCONNECT and a.level == loc.LV_MAJOR and a.scope == loc.SCOPE_INSIDE_NODE
    assert loc.unreachable_cards(ev) == [("node-1", 5)]


def test_lossy_intra_node_link_is_localized_to_the_link(sp):
    n = sp.nodes["node-2"].devices
    pair = {n[3], n[7]}

    alarms = loc.localize(evidence(sp, lambda p: {p.src_sdid, p.dst_sdid} == pair, loss=30.0), sp)
    assert len(alarms) == 1
    a = alarms[0]
    assert (a.kind, a.node, a.phy, a.peer_node, a.peer_phy) == ("link", "node-2", 3, "node-2", 7)
    assert a.fault_type == loc.FT_LOSS and a.level == loc.LV_MINOR and a.scope == loc.SCOPE_INSIDE_NODE
    assert len(a.paths) == 2  # both directions merged


def test_slow_inter_node_link_gives_code_between_nodes(sp):
    s, d = sp.nodes["node-0"].devices[2], sp.nodes["node-3"].devices[2]
    alarms = loc.localize(evidence(sp, lambda p: {p.src_sdid, p.dst_sdid} == {s, d}, delay_fault=True), sp)
    assert [(a.kind, a.fault_type, a.scope) for a in alarms] == [("link", loc.FT_DELAY, "between_nodes")]
    assert (alarms[0].node, alarms[0].peer_node) == ("node-0", "node-3")


def test_dead_node_is_localized_to_the_node_even_when_it_stops_reporting(sp):
    def dead(p):
        return "node-3" in (p.src_node, p.dst_node)

    for skip in (None, "node-3"):
        alarms = loc.localize(evidence(sp, dead, skip_src_node=skip), sp)
        assert [(a.kind, a.node, a.scope, a.level) for a in alarms] == [
            ("node", "node-3", "not_converged", 2)
        ]


def test_degraded_plane_is_localized_to_the_plane(sp):
    def plane1(p):
        return p.src_node != p.dst_node and sp.plane_of(p.src_phy) == 1

    alarms = loc.localize(evidence(sp, plane1, loss=40.0), sp)
    assert [(a.kind, a.plane, a.scope) for a in alarms] == [("plane", 1, "not_converged")]
    assert alarms[0].nodes == NODES and alarms[0].fault_type == loc.FT_LOSS


def test_two_node_pod_dead_node_is_not_taken_for_a_plane():
    sp2 = topology.build_super_pod(0, ["a", "b"], planes=2)
    alarms = loc.localize(evidence(sp2, lambda p: "b" in (p.src_node, p.dst_node)), sp2)
    assert [(a.kind, a.node) for a in alarms] == [("node", "b")]


def test_a_quiet_node_is_not_a_network_fault(sp):
    # node-1 sends nothing (its noded stopped): its own paths are missing, every other path is fine
    assert loc.localize(evidence(sp, lambda p: False, skip_src_node="node-1"), sp) == []


def test_suppression_by_key():
    s = Suppressor(60)
    assert s.admit("a-b-1-0", 0.0)
    assert not s.admit("a-b-1-0", 30.0)  # repeat within the period: dropped, time refreshed
    assert not s.admit("a-b-1-0", 80.0)  # 80 - 30 < 60: still live
    assert s.admit("a-b-2-0", 80.0)  # another key
    assert s.admit("a-b-1-0", 141.0)  # 141 - 80 >= 60: expired
    assert s.suppressed == 2
    zero = Suppressor(0)
    assert zero.admit("k", 1.0) and zero.admit("k", 1.0)
    with pytest.raises(ValueError):
        Suppressor(-1)


P = 10_000


def rows_for(sp, pairs, k, lossy=frozenset(), loss=0.3):
    out = []
    for p in pairs:
        lr = loss if (p.src_sdid, p.dst_sdid) in lossy else 0.0
        out.append(PingRow(p.task_id, "0", str(p.src_sdid), "0", str(p.dst_sdid), 4, 6, 5, lr, k * P + 100))
    return out


def test_analyzer_occur_suppress_recover_and_faults(sp):
    pairs = pinglist.generate(sp)
    an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P, suppress_s=25))
    a, b = sp.nodes["node-0"].devices[1], sp.nodes["node-0"].devices[4]
    lossy = {(a, b), (b, a)}
    history = []
    for k in range(20):
        bad = lossy if 9 <= k < 14 else set()
        assert an.ingest(rows_for(sp, pairs, k, bad), now_ms=k * P + 200)["accepted"] == len(pairs)
        history.append(an.analyze(k))
    assert all(not r.alarms for r in history[:9])
    assert [len(r.alarms) for r in history[9:14]] == [1] * 5
    assert history[9].occurred == [f"link:{a}-{b}"]
    # suppression 25 s: each repeat (every 10 s) refreshes the key, so only the first emission passes
    assert [len(r.emitted) for r in history[9:14]] == [1, 0, 0, 0, 0]
    an2 = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P))
    for k in range(11):
        an2.ingest(rows_for(sp, pairs, k, lossy if k >= 9 else set()))
        an2.analyze(k)
    found = an2.detections()
    assert [(d.node, d.device_type, d.device_id, d.scope, d.super_pod_id) for d in found] == [
        ("node-0", "NPU", 1, "inside_node", "0")
    ]
    alarms = found[0].alarms
    assert alarms[0]["peerNode"] == "node-0" and alarms[0]["peerPhyId"] == 4 and alarms[0]["kind"] == "link"
    assert found[0].fault_types == ("loss",) and found[0].first_ms <= found[0].last_ms
    # recovery: healthy at 14 and 15 -> recovered after 2 clean periods
    assert history[14].recovered == [] and history[15].recovered == [f"link:{a}-{b}"]
    assert an.detections() == [] and an.status()["alarms"] == []


def test_analyzer_dead_npu_is_an_unreachable_card_and_recovers(sp):
    pairs = pinglist.generate(sp)
    an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P))
    dead = sp.nodes["node-2"].devices[9]
    touching = {(p.src_sdid, p.dst_sdid) for p in pairs if dead in (p.src_sdid, p.dst_sdid)}
    for k in range(12):
        an.ingest(rows_for(sp, pairs, k, touching if 5 <= k < 9 else set(), loss=1.0))
        an.analyze(k)
        if k == 5:
            got = {(d.node, d.device_type, d.device_id, d.scope, len(d.alarms)) for d in an.detections()}
            assert got == {
                ("node-2", "NPU", 9, "inside_node", 1),
                ("node-2", "NPU", 9, "card_unreachable", 0),
            }
            st = an.status()
            assert st["unreachableCards"][0]["phyId"] == 9 and st["latest"]["faultyPaths"] == len(touching)
    assert an.detections() == []


def test_analyzer_skips_rows_not_in_ping_list_and_unknown_addresses(sp):
    pairs = pinglist.generate(sp, intra="ring")
    an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P))
    n0 = sp.nodes["node-0"].devices
    rows = [
        PingRow(0, "0", str(n0[0]), "0", str(n0[1]), 1, 1, 1, 0.0, P),  # ring pings +2, not +1
        PingRow(0, "0", "999", "0", str(n0[1]), 1, 1, 1, 0.0, P),
        PingRow(0, "0", "abc", "0", str(n0[1]), 1, 1, 1, 0.0, P),
        PingRow(0, "0", str(n0[0]), "0", str(n0[2]), 1, 1, 1, 2.0, P),
    ]
    assert an.ingest(rows) == {"not_in_ping_list": 1, "unknown_address": 2, "loss_range": 1, "accepted": 0}
    assert an.status()["rejectedRows"] == {"loss_range": 1, "not_in_ping_list": 1, "unknown_address": 2}


def test_stale_alarm_dropped_when_its_node_stops_reporting(sp):
    pairs = pinglist.generate(sp)
    an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P, stale_periods=3))
    a, b = sp.nodes["node-1"].devices[0], sp.nodes["node-1"].devices[2]
    lossy = {(a, b), (b, a)}
    for k in range(10):
        an.ingest(rows_for(sp, pairs, k, lossy if k == 9 else set()))
        an.analyze(k)
    assert len(an.active) == 1
    others = [p for p in pairs if p.src_node != "node-1"]
    for k in range(10, 13):  # node-1 stops reporting; its link has no data -> neither fault nor health
        an.ingest(rows_for(sp, others, k))
        r = an.analyze(k)
        assert r.alarms == []
    assert r.recovered == [f"link:{a}-{b}"]
