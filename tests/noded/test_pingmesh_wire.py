"""noded's FD-OL slow-network edge (noded.pingmesh.wire): what clusterd pushes read back into fdol's
dataclasses; wire rows written as CSV records."""

from __future__ import annotations

import pytest

from clusterd.detectors import fdol_edge as edge
from faultmesh._pb import agent_pb2
from fdol.slownet import config as pmconfig
from fdol.slownet import csvfile, topology
from noded.pingmesh import wire


def test_config_round_trip():
    cfg = pmconfig.parse_config(
        {"global": {"activate": "on", "task_interval": 5}, "3": '{"activate":"off","task_interval":1}'}
    )
    assert wire.config_from_pb(edge.config_to_pb(cfg)) == cfg
    bad = agent_pb2.PingmeshConfig(
        activations={"global": agent_pb2.PingmeshActivation(activate=True, task_interval_s=99)}
    )
    with pytest.raises(pmconfig.PingmeshConfigError):
        wire.config_from_pb(bad)


def test_topology_round_trip_and_rejections():
    sp = topology.build_super_pod(3, ["n0", "n1"], npus_per_node=4)
    back = wire.topology_from_pb(edge.topology_to_pb(sp))
    assert back.super_pod_id == "3" and back.planes is None
    assert {n: (t.server_index, t.devices) for n, t in back.nodes.items()} == {
        n: (t.server_index, t.devices) for n, t in sp.nodes.items()
    }
    node = agent_pb2.TopologyNode
    for bad, why in [
        (agent_pb2.SuperPodTopology(nodes=[node(node_name="a", server_index=1, phy_id_to_sdid={0: 1})]), "super_pod_id"),
        (agent_pb2.SuperPodTopology(super_pod_id="0", nodes=[node(server_index=1, phy_id_to_sdid={0: 1})]), "without a name"),
        (agent_pb2.SuperPodTopology(super_pod_id="0", nodes=[node(node_name="a", server_index=1, phy_id_to_sdid={0: 1}),
                                                              node(node_name="a", server_index=2, phy_id_to_sdid={1: 2})]), "twice"),
        (agent_pb2.SuperPodTopology(super_pod_id="0", nodes=[node(node_name="a", server_index=1, phy_id_to_sdid={64: 1})]), "out of range"),
        (agent_pb2.SuperPodTopology(super_pod_id="0", nodes=[node(node_name="a", server_index=1, phy_id_to_sdid={0: 5}),
                                                              node(node_name="b", server_index=2, phy_id_to_sdid={0: 5})]), "SDID 5"),
    ]:  # fmt: skip
        with pytest.raises(topology.TopologyError, match=why):
            wire.topology_from_pb(bad)


def test_wire_row_to_csv_line_and_back(tmp_path):
    r = agent_pb2.PingResult(ping_task_id=0, src_type="0", src_addr="6094863", dst_type="0", dst_addr="4194304",
                             min_delay=-1, max_delay=-1, avg_delay=-1, min_loss_rate=1.0, max_loss_rate=1.0,
                             avg_loss_rate=1.0, timestamp_ms=1755687818727, super_pod_id="0", src_phy_id=15)  # fmt: skip
    line = wire.csv_line(r)
    assert line == "0,0,6094863,0,4194304,-1,-1,-1,1.000,1.000,1.000,1755687818727"  # the reference doc's row
    p = tmp_path / "ping_result_1.csv"
    p.write_text(csvfile.CSV_HEADER + "\n" + line + "\n")
    rows, bad = csvfile.read_csv_rows(p)
    assert bad == 0 and rows == [wire.record_from_pb(r)]
