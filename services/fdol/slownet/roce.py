"""The RoCE parameter plane between super pods: who probes, whom, and the plane as one topology.

Source: reference fdol.md §8.1 (``super-pod-roce/``: ``super-pod-roce.json``
``{"superPodList": [ids]}``, ``ping_list_<spId>_<serverIndex>.json``), §8.2 (RoCE path
``ROCESwitch#SuperPod-<id>#NSlot-0#NPU-<phyId>.<ip>``; per super pod max(5, 1 % of its OSes), one NPU
each; at least 5 per pod and 2 pods; ping object = IP, type 0), §8.7 (super pod type 7, RoCE switch
type 8, critical) and noded.md §6 (RoCE ICMP pings in user space, from
``super-pod-roce/ping_list_<spid>_<idx>.json``; at most 16 ping items per node; the ``roce`` key of
pingmesh-config switches it).

The endpoints are the nodes with a ``RoceIP`` in their super pod's topology
(:class:`fdol.slownet.topology.NodeTopology`). :func:`build_plane` picks, per super pod, the
``max(min_per_pod, ceil(rate x nodes))`` nodes spread evenly over the server indexes (the reference
picks at random; faultmesh picks deterministically so a restart keeps the same ping lists) and
returns a :class:`RocePlane`: its :attr:`RocePlane.sp` is a :class:`SuperPod` with id ``"roce"``
whose nodes carry one NPU each under a synthetic SDID (so the window, localization and analyzer of
the HCCS super pods work unchanged) and whose ``groups`` map each node to its super pod.

Probes (:meth:`RocePlane.pairs`, same axis as the reference): the k-th endpoint of a super pod
pings the k-th endpoint (modulo their count) of every other super pod, at most ``max_dests`` (16)
of them; with more pods, endpoint k takes the pods at offsets ``d`` with ``(d - 1) % n == k`` (n its
pod's endpoints), so every ordered pod pair is still probed. Rows carry IP addresses;
:meth:`RocePlane.to_plane_row` maps them to the synthetic SDIDs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fdol.slownet.pinglist import PingPair
from fdol.slownet.topology import NodeTopology, SuperPod, make_sdid
from fdol.slownet.window import PingRow

PLANE_ID = "roce"
MIN_PER_POD = 5
RATE = 0.01
MAX_DESTS = 16  # noded runs at most 16 RoCE ping items per node (reference roceping maxPingListSize)
TASK_ROCE = 0
ICMP_PKT_SIZE = 28


class RoceError(ValueError):
    """A RoCE plane that cannot be built (the message says why)."""


@dataclass(frozen=True)
class RoceEndpoint:
    """One probing node of the plane: its super pod, node, server index, the NPU (phy) whose port
    carries the node's RoCE IP, the IP, and its synthetic SDID in the plane topology."""

    super_pod_id: str
    node: str
    server_index: int
    phy: int
    ip: str
    sdid: int


@dataclass
class RocePlane:
    """The plane (module doc): ``pods`` super pod id -> its endpoints, ``sp`` the plane topology,
    ``by_ip`` / ``by_sdid`` endpoint lookups."""

    pods: dict[str, list[RoceEndpoint]]
    sp: SuperPod

    def __post_init__(self) -> None:
        eps = [e for v in self.pods.values() for e in v]
        self.by_ip = {e.ip: e for e in eps}
        self.by_sdid = {e.sdid: e for e in eps}

    def super_pod_list(self) -> dict[str, list[int]]:
        """The reference ``super-pod-roce.json`` body: ``{"superPodList": [ids]}``."""
        return {"superPodList": sorted(int(s) for s in self.pods)}

    def pairs(self, max_dests: int = MAX_DESTS) -> list[PingPair]:
        """Probed paths (module doc) as :class:`PingPair` on the synthetic SDIDs, task 0, sorted."""
        ids = sorted(self.pods, key=int)
        out: list[PingPair] = []
        count = len(ids)
        for i, spid in enumerate(ids):
            mine = self.pods[spid]
            for k, e in enumerate(mine):
                if count - 1 <= max_dests:
                    offsets = list(range(1, count))
                else:
                    offsets = [d for d in range(1, count) if (d - 1) % len(mine) == k][:max_dests]
                for d in offsets:
                    peer = self.pods[ids[(i + d) % count]]
                    t = peer[k % len(peer)]
                    out.append(PingPair(TASK_ROCE, e.node, e.phy, e.sdid, t.node, t.phy, t.sdid))
        out.sort(key=lambda p: (p.src_sdid, p.dst_sdid))
        return out

    def node_ping_list(self, node: str, max_dests: int = MAX_DESTS) -> dict[int, list[str]]:
        """One node's RoCE ping list: {its phy: [destination IPs]} (empty when not an endpoint)."""
        out: dict[int, list[str]] = {}
        for p in self.pairs(max_dests):
            if p.src_node == node:
                out.setdefault(p.src_phy, []).append(self.by_sdid[p.dst_sdid].ip)
        return out

    def reference_ping_list(self, node: str) -> list[dict[str, Any]]:
        """The reference ``ping_list_<spId>_<serverIndex>.json`` body of a node (IP objects, type 0)."""
        me = next((e for v in self.pods.values() for e in v if e.node == node), None)
        items = []
        for phy, dsts in self.node_ping_list(node).items():
            for ip in dsts:
                t = self.by_ip[ip]
                items.append({"srcType": 0, "dstType": 0, "pktSize": ICMP_PKT_SIZE, "srcCardPhyId": phy,
                              "srcAddr": me.ip, "dstAddr": ip, "dstCardPhyId": t.phy})  # fmt: skip
        return [{"pingList": items}]

    def to_plane_row(self, row: PingRow) -> PingRow:
        """A RoCE result row (IP addresses) on the plane's synthetic SDIDs; an unknown IP is kept as
        is (the analyzer counts it as ``unknown_address``)."""
        s, d = self.by_ip.get(row.src_addr), self.by_ip.get(row.dst_addr)
        return row._replace(
            src_addr=str(s.sdid) if s else row.src_addr, dst_addr=str(d.sdid) if d else row.dst_addr
        )


def _spread(items: list, k: int) -> list:
    """``k`` of ``items`` spread evenly (first, ..., last), in order."""
    if k >= len(items):
        return list(items)
    return [items[round(j * (len(items) - 1) / (k - 1))] for j in range(k)] if k > 1 else items[:1]


def build_plane(
    super_pods: Iterable[SuperPod], min_per_pod: int = MIN_PER_POD, rate: float = RATE
) -> RocePlane:
    """The RoCE plane of these super pods (module doc). Super pods with fewer than ``min_per_pod``
    nodes having a ``RoceIP`` are left out (as in the reference). Raises :class:`RoceError` when
    fewer than two super pods are left, when two nodes share an IP, or beyond 1023 endpoints."""
    pods: dict[str, list[RoceEndpoint]] = {}
    seen: dict[str, str] = {}
    count = 0
    for sp in sorted(super_pods, key=lambda s: int(s.super_pod_id)):
        nodes = sorted((n for n in sp.nodes.values() if n.roce_ip), key=lambda n: n.server_index)
        for n in nodes:
            if n.roce_ip in seen:
                raise RoceError(f"RoCE IP {n.roce_ip} on both {seen[n.roce_ip]} and {n.name}")
            seen[n.roce_ip] = n.name
        if len(nodes) < min_per_pod:
            continue
        k = max(min_per_pod, math.ceil(rate * len(nodes)))
        eps = []
        for n in _spread(nodes, k):
            phy = n.roce_phy if n.roce_phy is not None else min(n.devices)
            count += 1
            if count > 0x3FF:
                raise RoceError("more than 1023 RoCE endpoints")
            eps.append(
                RoceEndpoint(sp.super_pod_id, n.name, n.server_index, phy, n.roce_ip, make_sdid(count, phy))
            )
        pods[sp.super_pod_id] = eps
    if len(pods) < 2:
        raise RoceError(
            f"the RoCE plane needs 2 super pods with {min_per_pod} RoCE nodes each, found {len(pods)}"
        )
    nodes = {
        e.node: NodeTopology(e.node, sdid_index(e.sdid), {e.phy: e.sdid}, e.ip, e.phy)
        for v in pods.values()
        for e in v
    }
    groups = {e.node: e.super_pod_id for v in pods.values() for e in v}
    return RocePlane(pods, SuperPod(PLANE_ID, nodes, groups=groups, version="roce"))


def sdid_index(sdid: int) -> int:
    """The synthetic server index of an endpoint SDID (its position in the plane, from 1)."""
    return (sdid >> 22) & 0x3FF
