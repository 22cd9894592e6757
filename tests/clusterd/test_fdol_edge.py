"""clusterd's FD-OL slow-network edge (clusterd.detectors.fdol_edge): detections -> fault records
with the reference codes and levels, alarms and status shown with codes, messages for noded."""

from __future__ import annotations

import json

from clusterd.detectors import fdol_edge as edge
from fdol.slownet import config as pmconfig
from fdol.slownet import localize as loc
from fdol.slownet import pinglist, topology
from fdol.slownet.analyzer import SlowNetDetection
from fdol.slownet.csvfile import PingRecord


def test_every_scope_has_a_code_and_the_levels_match_the_reference_table(fault_tables):
    assert set(edge.SCOPE_CODES) == set(loc.SCOPES)
    assert set(edge.CODE_LEVELS) == set(edge.SCOPE_CODES.values())
    assert edge.SCOPE_CODES[loc.SCOPE_INSIDE_NODE] == "200001010"
    assert edge.SCOPE_CODES[loc.SCOPE_CARD_UNREACHABLE] == "220001001"
    table = json.loads((fault_tables / "publicFaultConfiguration.json").read_text())["publicFaultCode"]
    for code, level in edge.CODE_LEVELS.items():
        assert code in table[f"{level}Codes"], code


def _alarm(**kw):
    base = {"kind": "link", "srcId": "1", "dstId": "2", "faultTypeName": "loss", "scope": "between_nodes"}
    return {**base, **kw}


def test_detection_becomes_a_fault_with_code_level_and_alarms():
    d = SlowNetDetection(
        "0", "node-0", "NPU", 2, loc.SCOPE_BETWEEN_NODES, 1000, 2000, "link node-0/2 <-> node-1/2",
        (_alarm(), _alarm(dstId="3", faultTypeName="delay")),
    )  # fmt: skip
    f = edge.fault(d)
    assert (f.source, f.node, f.device_type, f.device_id, f.code, f.level, f.assertion) == (
        "slownet", "node-0", "NPU", 2, "200001011", "NotHandleFault", "occur"
    )  # fmt: skip
    assert (f.first_seen_ms, f.last_seen_ms) == (1000, 2000)
    assert f.attributes["superPodId"] == "0" and f.attributes["faultType"] == "delay,loss"
    alarms = json.loads(f.attributes["alarms"])
    assert [a["code"] for a in alarms] == ["200001011"] * 2 and all("scope" not in a for a in alarms)
    card = edge.fault(SlowNetDetection("0", "node-1", "NPU", 5, loc.SCOPE_CARD_UNREACHABLE, 1, 1, "x"))
    assert (card.code, card.level) == ("220001001", "SeparateNPU") and "alarms" not in card.attributes
    assert edge.faults([d, d]) == [f, f]


def test_status_shows_codes_not_scopes():
    st = edge.status_json({"superPodId": "0", "alarms": [_alarm(scope="not_converged")], "latest": {}})
    assert st["alarms"][0]["code"] == "200001012" and "scope" not in st["alarms"][0]
    assert st["superPodId"] == "0" and edge.status_json({"latest": {}})["alarms"] == []


def test_messages_for_noded():
    cfg = pmconfig.parse_config({"global": {"activate": "on", "task_interval": 5}})
    m = edge.config_to_pb(cfg)
    assert (m.activations["global"].activate, m.activations["global"].task_interval_s) == (True, 5)
    sp = topology.build_super_pod(7, ["b", "a"], npus_per_node=2)
    t = edge.topology_to_pb(sp)
    assert t.super_pod_id == "7" and [n.node_name for n in t.nodes] == ["b", "a"]  # by server index
    assert dict(t.nodes[1].phy_id_to_sdid) == sp.nodes["a"].devices
    mine = pinglist.by_node(pinglist.generate(sp))["a"]
    lst = edge.ping_list_to_pb(pinglist.node_ping_list("7", mine))
    assert lst.uid == pinglist.list_uid("7", mine) and [t.src_phy_id for t in lst.tasks] == [0, 1]
    assert list(lst.tasks[0].dst_addrs) == list(pinglist.node_ping_list("7", mine).tasks[0])


def test_row_from_pb_matches_the_csv_record_row():
    from faultmesh._pb import agent_pb2

    r = agent_pb2.PingResult(ping_task_id=1, src_type="0", src_addr="1", dst_type="0", dst_addr="2",
                             min_delay=3, max_delay=5, avg_delay=4, min_loss_rate=0.1, max_loss_rate=0.3,
                             avg_loss_rate=0.2, timestamp_ms=99, super_pod_id="0")  # fmt: skip
    rec = PingRecord(1, "0", "1", "0", "2", 3, 5, 4, 0.1, 0.3, 0.2, 99)
    assert edge.row_from_pb(r) == rec.row()
    assert rec.row().loss_rate == 0.2 and rec.row().key == (1, "0", "1", "0", "2")
