"""Slow-network detection: the RoCE parameter plane between super pods (issue 16; reference
fdol.md §8.1-§8.2 ``super-pod-roce``): functions over :class:`clusterd.slownet.state.SlowNetState`.

When pingmesh-config has a ``roce`` entry and at least two super pods have 5 nodes with a
``RoceIP`` each, the plane (:func:`fdol.slownet.roce.build_plane`) is analysed as one more "super
pod" with id ``roce``: its probing nodes get their RoCE ping list (a ``PingList`` with
``super_pod_id`` ``roce`` whose destinations are IPs; no topology), their rows (``super_pod_id``
``roce``, IP addresses) are mapped to the plane's synthetic SDIDs and analysed with the ``roce``
entry's period; alarms become slownet faults like the HCCS ones (super-pod uplink and switch
alarms: code 200001012). The plane is rebuilt whenever a topology or the config changes; with
``--slownet-csv-root`` the reference's ``super-pod-roce/super-pod-roce.json`` is written too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from clusterd.detectors import fdol_edge as edge
from clusterd.slownet.state import PodState, SlowNetState
from faultmesh.files import atomic_write
from faultmesh.log import event
from fdol.slownet import pinglist as pl
from fdol.slownet import roce

log = logging.getLogger("clusterd.slownet")


def rebuild_plane(state: SlowNetState) -> None:
    """(Re)build the plane from the current topologies and config into ``state`` (``pods['roce']``
    and ``roce_plane``), or drop it."""
    spid = roce.PLANE_ID
    plane = None
    if roce.PLANE_ID in state.config:
        sps = [p.sp for s, p in state.pods.items() if s != spid]
        try:
            plane = roce.build_plane(sps)
        except roce.RoceError as e:
            event(log, logging.INFO, "roce plane not built", reason=str(e))
    old = state.pods.get(spid)
    if plane is None:
        state.pods.pop(spid, None)
        state.roce_plane = None
        return
    pairs = plane.pairs()
    params = state.params(spid)
    if old is None or old.analyzer.params.period_ms != params.period_ms:
        state.pods[spid] = PodState(plane.sp, pairs, params)
    else:
        old.set_topology(plane.sp, pairs)
    state.roce_plane = plane
    event(log, logging.INFO, "roce plane applied", super_pods=len(plane.pods),
          endpoints=len(plane.sp.nodes), paths=len(pairs))  # fmt: skip
    if state.cfg.slownet_csv_root:
        d = Path(state.cfg.slownet_csv_root) / "cluster" / "super-pod-roce"
        try:
            d.mkdir(parents=True, exist_ok=True)
            atomic_write(d / "super-pod-roce.json", json.dumps(plane.super_pod_list()))
        except OSError as e:
            event(log, logging.WARNING, "super-pod-roce.json not written", error=str(e))


def roce_list_pb(state: SlowNetState, node: str):
    """The RoCE ``PingList`` of a probing node (None when the node does not probe)."""
    plane = state.roce_plane
    if plane is None or node not in plane.sp.nodes:
        return None
    lst = plane.node_ping_list(node)
    uid = pl.list_uid(roce.PLANE_ID, [p for p in plane.pairs() if p.src_node == node])
    return edge.ping_list_to_pb(
        pl.NodePingList(roce.PLANE_ID, uid, {phy: tuple(d) for phy, d in lst.items()})
    )
