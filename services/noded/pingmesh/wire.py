"""noded's edge to FD-OL slow-network (:mod:`fdol.slownet`): the agent stream's protobuf messages
<-> fdol's dataclasses.

Incoming from clusterd (which builds them with :mod:`clusterd.detectors.fdol_edge`): pingmesh-config
and topology. Outgoing: result rows — noded builds ``faultmesh.v1.PingResult`` rows
(:func:`noded.pingmesh.results.rows_from_samples`) and writes them to the CSV as
:class:`fdol.slownet.csvfile.PingRecord`.
"""

from __future__ import annotations

from faultmesh._pb import agent_pb2
from fdol.slownet import csvfile
from fdol.slownet.config import Activation, parse_config
from fdol.slownet.topology import NodeTopology, SuperPod, from_nodes


def config_from_pb(m: agent_pb2.PingmeshConfig) -> dict[str, Activation]:
    """``faultmesh.v1.PingmeshConfig`` -> {key: Activation}. Raises
    :class:`fdol.slownet.config.PingmeshConfigError` (a ``ValueError``) for an invalid entry."""
    return parse_config(
        {
            k: {"activate": "on" if a.activate else "off", "task_interval": a.task_interval_s}
            for k, a in m.activations.items()
        }
    )


def topology_from_pb(m: agent_pb2.SuperPodTopology) -> SuperPod:
    """``faultmesh.v1.SuperPodTopology`` -> :class:`SuperPod`. Raises
    :class:`fdol.slownet.topology.TopologyError` (a ``ValueError``)."""
    return from_nodes(
        m.super_pod_id,
        [NodeTopology(n.node_name, int(n.server_index), dict(n.phy_id_to_sdid)) for n in m.nodes],
    )


def record_from_pb(r: agent_pb2.PingResult) -> csvfile.PingRecord:
    """``faultmesh.v1.PingResult`` -> the CSV row (super pod and source phy are not CSV columns)."""
    return csvfile.PingRecord(
        int(r.ping_task_id), r.src_type, r.src_addr, r.dst_type, r.dst_addr,
        r.min_delay, r.max_delay, r.avg_delay, r.min_loss_rate, r.max_loss_rate, r.avg_loss_rate,
        int(r.timestamp_ms),
    )  # fmt: skip


def csv_line(r: agent_pb2.PingResult) -> str:
    """One ``ping_result_<idx>.csv`` line (no newline) for a wire row."""
    return csvfile.csv_line(record_from_pb(r))
