"""clusterd's edge to FD-OL slow-network (:mod:`fdol.slownet`): fdol dataclasses <-> fault records
and the agent stream's protobuf messages.

fdol names no fault code, level or wire message; this module decides them (reference fdol.md §8.8
and noded.md §6 "pingmesh-fault"; levels from clusterd's publicFaultConfiguration, checked by a test
against ../shared/data/fault-tables/publicFaultConfiguration.json):

=====================  =========  ==============
scope                  code       level
=====================  =========  ==============
``inside_node``        200001010  NotHandleFault
``between_nodes``      200001011  NotHandleFault
``not_converged``      200001012  NotHandleFault
``card_unreachable``   220001001  SeparateNPU
=====================  =========  ==============

Outgoing to noded: pingmesh-config, topology and ping list as ``faultmesh.v1`` messages (noded reads
them back with :mod:`noded.pingmesh.wire`). Incoming: ``faultmesh.v1.PingResult`` rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from faultmesh._pb import agent_pb2
from faultmesh.model import OCCUR, Fault
from fdol.slownet.analyzer import SlowNetDetection
from fdol.slownet.config import Activation
from fdol.slownet.localize import (
    SCOPE_BETWEEN_NODES,
    SCOPE_CARD_UNREACHABLE,
    SCOPE_INSIDE_NODE,
    SCOPE_NOT_CONVERGED,
)
from fdol.slownet.pinglist import NodePingList
from fdol.slownet.topology import SuperPod
from fdol.slownet.window import PingRow

SOURCE = "slownet"
SCOPE_CODES = {
    SCOPE_INSIDE_NODE: "200001010",
    SCOPE_BETWEEN_NODES: "200001011",
    SCOPE_NOT_CONVERGED: "200001012",
    SCOPE_CARD_UNREACHABLE: "220001001",
}
CODE_LEVELS = {
    "200001010": "NotHandleFault",
    "200001011": "NotHandleFault",
    "200001012": "NotHandleFault",
    "220001001": "SeparateNPU",
}


# -- detections -> faults ---------------------------------------------------------------------------
def alarm_json(alarm: dict[str, Any]) -> dict[str, Any]:
    """An alarm of :meth:`fdol.slownet.localize.Alarm.to_dict` as clusterd shows it: its ``scope``
    replaced by the fault ``code``. Raises ``KeyError`` for an unknown scope."""
    out = {k: v for k, v in alarm.items() if k != "scope"}
    out["code"] = SCOPE_CODES[alarm["scope"]]
    return out


def fault(d: SlowNetDetection) -> Fault:
    """The fault record of a detection: source ``slownet``, assertion occur, the code and level of its
    scope (module doc); attributes ``superPodId``, ``description`` and, when alarms are merged in,
    ``alarms`` (JSON list of :func:`alarm_json`) and ``faultType`` (comma-separated names)."""
    code = SCOPE_CODES[d.scope]
    attrs = {"superPodId": d.super_pod_id, "description": d.description}
    if d.alarms:
        attrs["alarms"] = json.dumps([alarm_json(a) for a in d.alarms], sort_keys=True)
        attrs["faultType"] = ",".join(d.fault_types)
    return Fault(
        SOURCE,
        d.node,
        d.device_type,
        d.device_id,
        code,
        CODE_LEVELS[code],
        OCCUR,
        d.first_ms,
        d.last_ms,
        attrs,
    )


def faults(detections: Iterable[SlowNetDetection]) -> list[Fault]:
    """:func:`fault` of each detection, in order."""
    return [fault(d) for d in detections]


def status_json(status: dict[str, Any]) -> dict[str, Any]:
    """:meth:`fdol.slownet.analyzer.SuperPodAnalyzer.status` with each alarm's scope shown as its code."""
    return {**status, "alarms": [alarm_json(a) for a in status.get("alarms", [])]}


# -- protobuf -----------------------------------------------------------------------------------------
def config_to_pb(cfg: dict[str, Activation]) -> agent_pb2.PingmeshConfig:
    """pingmesh-config {key: Activation} -> ``faultmesh.v1.PingmeshConfig``."""
    return agent_pb2.PingmeshConfig(
        activations={
            k: agent_pb2.PingmeshActivation(activate=a.activate, task_interval_s=a.task_interval)
            for k, a in cfg.items()
        }
    )


def topology_to_pb(sp: SuperPod) -> agent_pb2.SuperPodTopology:
    """A super pod -> ``faultmesh.v1.SuperPodTopology``, nodes by server index (planes are not
    carried: noded does not need them)."""
    return agent_pb2.SuperPodTopology(
        super_pod_id=sp.super_pod_id,
        nodes=[
            agent_pb2.TopologyNode(
                node_name=n.name, server_index=n.server_index, phy_id_to_sdid=dict(n.devices)
            )
            for n in sorted(sp.nodes.values(), key=lambda n: n.server_index)
        ],
    )


def ping_list_to_pb(lst: NodePingList) -> agent_pb2.PingList:
    """One node's ping list -> ``faultmesh.v1.PingList`` (one ``PingTask`` per source phy id)."""
    return agent_pb2.PingList(
        super_pod_id=lst.super_pod_id,
        uid=lst.uid,
        tasks=[agent_pb2.PingTask(src_phy_id=phy, dst_addrs=list(d)) for phy, d in lst.tasks.items()],
    )


def row_from_pb(r: agent_pb2.PingResult) -> PingRow:
    """``faultmesh.v1.PingResult`` -> the analysis row (loss = avg_loss_rate)."""
    return PingRow(
        int(r.ping_task_id), r.src_type, r.src_addr, r.dst_type, r.dst_addr,
        r.min_delay, r.max_delay, r.avg_delay, r.avg_loss_rate, int(r.timestamp_ms),
    )  # fmt: skip
