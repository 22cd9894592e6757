"""Ping-list generation from a super-pod topology: who pings whom.

Source: reference fdol.md §8.3 (A3 intra-node ring over SDIDs, rotate by 2; output items
``{srcType, dstType, pktSize, srcCardPhyId, dstCardPhyId, srcAddr, dstAddr}`` in
``ping_list_<serverIndex>.json`` = ``[{"pingList": [...]}]``) and noded.md §6 (historic rule: task 0 =
every other NPU of the node, task 1 = the NPU with the same physical id on every other node; at most
48 destinations per task, addresses = SDIDs).

Deliberate difference (design.md "Deliberate differences"): the reference's A3 path loses every
inter-node pair (empty address column), so only intra-node paths are ever probed. faultmesh probes:

- **task 0, intra-node**: ``intra="mesh"`` (default) every other NPU of the node (so a link between
  any two NPUs of a node is on a probed path), or ``intra="ring"`` the NPU ``ring_step`` positions
  ahead in SDID order (the reference's rotate-by-2 ring; every NPU is still probed: on a node
  whose NPU count divides ``ring_step`` the step is 1);
- **task 1, inter-node**: the NPU with the same rank (same physical id on regular nodes) on every
  other node, when the super pod has at most ``max_dests + 1`` nodes; on bigger pods, the NPU of rank
  r probes the nodes at offsets ``d`` with ``(d - 1) % R == r`` (R = NPUs of the node), so every
  ordered node pair is still probed and no task exceeds ``max_dests`` — as long as the pod has at
  most ``max_dests x R + 1`` nodes (769 for 16 NPUs); beyond that a node with few NPUs probes only
  the first ``max_dests`` offsets per NPU (the other nodes still probe it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from fdol.slownet.topology import SuperPod

TASK_INTRA = 0
TASK_INTER = 1
MAX_DESTS = 48  # hccsping info holds at most 48 destinations per task (noded.md §6)
PKT_SIZE = 1792


class PingListError(ValueError):
    """A ping list that cannot be built or parsed (the message says why)."""


@dataclass(frozen=True, slots=True)
class PingPair:
    """One probed path: source and destination NPU (node, phy id, SDID) and the hccsping task id."""

    task_id: int
    src_node: str
    src_phy: int
    src_sdid: int
    dst_node: str
    dst_phy: int
    dst_sdid: int


def generate(
    sp: SuperPod, intra: str = "mesh", ring_step: int = 2, max_dests: int = MAX_DESTS
) -> list[PingPair]:
    """All probed paths of super pod ``sp`` (rules in the module doc), sorted by (src SDID, task, dst SDID).

    Raises :class:`PingListError` for an unknown ``intra`` mode.
    """
    if intra not in ("mesh", "ring"):
        raise PingListError(f"intra must be 'mesh' or 'ring', not {intra!r}")
    pairs: list[PingPair] = []
    nodes = sorted(sp.nodes.values(), key=lambda n: n.server_index)
    ranked = {n.name: sorted(n.devices.items(), key=lambda kv: kv[1]) for n in nodes}  # (phy, sdid) by SDID
    for n in nodes:
        devs = ranked[n.name]
        k = len(devs)
        for i, (phy, sdid) in enumerate(devs):
            if intra == "mesh":
                dsts = [devs[j] for j in range(k) if j != i][:max_dests]
            else:
                step = ring_step if ring_step % k else 1  # a step of k would ping itself
                dsts = [devs[(i + step) % k]] if k > 1 else []
            pairs.extend(PingPair(TASK_INTRA, n.name, phy, sdid, n.name, dp, ds) for dp, ds in dsts)
    count = len(nodes)
    for i, n in enumerate(nodes):
        devs = ranked[n.name]
        r_count = len(devs)
        for r, (phy, sdid) in enumerate(devs):
            if count - 1 <= max_dests:
                offsets = range(1, count)
            else:
                offsets = [d for d in range(1, count) if (d - 1) % r_count == r][:max_dests]
            for d in offsets:
                peer = nodes[(i + d) % count]
                pdevs = ranked[peer.name]
                if phy in peer.devices:
                    dphy, dsdid = phy, peer.devices[phy]
                else:
                    dphy, dsdid = pdevs[r % len(pdevs)]
                pairs.append(PingPair(TASK_INTER, n.name, phy, sdid, peer.name, dphy, dsdid))
    pairs.sort(key=lambda p: (p.src_sdid, p.task_id, p.dst_sdid))
    return pairs


def by_node(pairs: list[PingPair]) -> dict[str, list[PingPair]]:
    """Group paths by source node (the node whose noded runs the probes)."""
    out: dict[str, list[PingPair]] = {}
    for p in pairs:
        out.setdefault(p.src_node, []).append(p)
    return out


def list_uid(super_pod_id: str, pairs: list[PingPair]) -> str:
    """sha256 hex over the super pod id and the (src, task, dst) triples: unchanged list -> same uid."""
    h = hashlib.sha256(super_pod_id.encode())
    for p in pairs:
        h.update(f"|{p.src_sdid},{p.task_id},{p.dst_sdid}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class NodePingList:
    """One node's ping list as clusterd pushes it: ``super_pod_id``, ``uid`` (:func:`list_uid`) and
    ``tasks`` — source phy id -> destination SDIDs as decimal strings, sorted numerically, each once.
    noded splits each source's destinations into task 0 / task 1 by the destination's server id."""

    super_pod_id: str
    uid: str
    tasks: dict[int, tuple[str, ...]]


def node_ping_list(super_pod_id: str, pairs: list[PingPair]) -> NodePingList:
    """One node's paths (:func:`by_node`) as a :class:`NodePingList`, sources in phy order."""
    tasks: dict[int, list[int]] = {}
    for p in pairs:
        tasks.setdefault(p.src_phy, []).append(p.dst_sdid)
    return NodePingList(
        super_pod_id,
        list_uid(super_pod_id, pairs),
        {phy: tuple(str(s) for s in sorted(set(d))) for phy, d in sorted(tasks.items())},
    )


def to_reference_json(pairs: list[PingPair], pkt_size: int = PKT_SIZE) -> list[dict[str, Any]]:
    """The reference ``ping_list_<serverIndex>.json`` body for these paths (fdol.md §8.3, A3 types 0)."""
    return [
        {
            "pingList": [
                {
                    "srcType": 0,
                    "dstType": 0,
                    "pktSize": pkt_size,
                    "srcCardPhyId": p.src_phy,
                    "srcAddr": str(p.src_sdid),
                    "dstAddr": str(p.dst_sdid),
                    "dstCardPhyId": p.dst_phy,
                }
                for p in pairs
            ]
        }
    ]


def parse_reference_json(data: str | bytes | list[Any]) -> dict[int, list[str]]:
    """A reference ping-list file -> {source phy id: sorted destination addresses}.

    Raises :class:`PingListError` when the file is not ``[{"pingList": [...]}]`` or an item lacks
    ``srcCardPhyId``/``dstAddr``.
    """
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError as e:
            raise PingListError(f"ping list is not JSON: {e}") from None
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], dict):
        raise PingListError("ping list must be a JSON array with exactly one object")
    items = data[0].get("pingList")
    if not isinstance(items, list):
        raise PingListError("ping list object has no pingList array")
    out: dict[int, set[str]] = {}
    for it in items:
        if not isinstance(it, dict) or "srcCardPhyId" not in it or not it.get("dstAddr"):
            raise PingListError(f"bad ping list item {it!r}")
        try:
            phy = int(it["srcCardPhyId"])
        except (TypeError, ValueError):
            raise PingListError(f"bad srcCardPhyId in {it!r}") from None
        out.setdefault(phy, set()).add(str(it["dstAddr"]))
    return {k: sorted(v, key=_addr_sort_key) for k, v in sorted(out.items())}


def _addr_sort_key(a: str) -> tuple[int, int | str]:
    return (0, int(a)) if a.isdigit() else (1, a)
