"""Localization of faulty paths to an NPU, an NPU-to-NPU link, a node, or a switch plane.

Source: reference fdol.md §8.7 (layered scoring: count the objects faulty paths share, the most
shared object is the candidate, NPU alarms major, links minor, racks/planes critical; object types
0 NPU, 4 work node, 5 L1 plane) and §8.8 (the scopes its codes name). faultmesh's layering, in its
own words:

1. Every object — each NPU, each node, each node's uplinks (its inter-node paths only: a node cut
   off from the fabric while its own HCCS works), each plane (when the topology names planes) — gets
   ``ratio = faulty paths touching it / probed paths touching it`` (probed = paths with data in the
   period; a node that stops reporting contributes no paths, so it is never taken for a network
   fault). A path touches a plane when it is inter-node and one of its end phys is in the plane.
2. Greedily, the object with the best ``(ratio in 5 % steps, faulty paths)`` whose ratio reaches its
   layer's bound (``npu_ratio``/``node_ratio``/``plane_ratio``, default 0.5) and that explains enough
   paths (2 for an NPU, 3 for a node or plane; a plane's paths must span 3 nodes, or 2 in a two-node
   pod) becomes an alarm; its faulty paths are explained and removed; repeat.
   A dead node ties its NPUs at ratio 1 but explains more paths; a degraded plane beats the NPUs in
   it by ratio; a dead NPU beats its node by ratio.
   On the RoCE plane between super pods (a topology with ``groups``: node -> super pod), the
   paths between super pods also touch each end's super pod (its uplink to the RoCE switch) and
   the RoCE switch; with 3 super pods or more, a super pod (object type 7) or the switch (8,
   spanning 3 super pods) can be blamed. Ties go to the wider object (switch, super pod, plane),
   then NPU, node, uplinks; and a wider object within 10 % of the best ratio that explains 3 times
   its paths wins over it (a few of a group's paths under the threshold in one period must not
   split the group into its members).
3. Each remaining faulty path is an NPU-to-NPU link alarm (both directions of a pair merge).

Fault type: loss -> 1, or 2 (disconnect) when the average loss of the alarm's lossy paths is >= 80 %;
delay only -> 0. Scope (:attr:`Alarm.scope`, the distinction §8.8 gives its codes): both ends NPUs
on the same server -> ``inside_node``, on different servers -> ``between_nodes``, anything else
(node, plane) -> ``not_converged``. :func:`unreachable_cards` finds the cards no destination answers
(scope ``card_unreachable``, reference noded.md §6 "pingmesh-fault"). This library names no fault
code or level: the service that raises faults maps scopes to codes (clusterd's FD-OL edge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from fdol.slownet.topology import MAX_PHY_ID, SuperPod, sdid_server_id

# object types (fdol.md §8.7)
OBJ_NPU = 0
OBJ_NODE = 4
OBJ_PLANE = 5
OBJ_SUPER_POD = 7
OBJ_ROCE_SWITCH = 8
# which object wins a tie (same ratio step, same paths explained)
_KIND_RANK = {"switch": 5, "group": 4, "plane": 3, "npu": 2, "node": 1, "uplink": 0}
# fault types
FT_DELAY = 0
FT_LOSS = 1
FT_DISCONNECT = 2
FAULT_TYPE_NAMES = {FT_DELAY: "delay", FT_LOSS: "loss", FT_DISCONNECT: "disconnect"}
# levels
LV_MINOR, LV_MAJOR, LV_CRITICAL = 0, 1, 2
# scopes (the distinctions of fdol.md §8.8 and noded.md §6 "pingmesh-fault"; codes are the caller's)
SCOPE_INSIDE_NODE = "inside_node"
SCOPE_BETWEEN_NODES = "between_nodes"
SCOPE_NOT_CONVERGED = "not_converged"
SCOPE_CARD_UNREACHABLE = "card_unreachable"
SCOPES = (SCOPE_INSIDE_NODE, SCOPE_BETWEEN_NODES, SCOPE_NOT_CONVERGED, SCOPE_CARD_UNREACHABLE)
DISCONNECT_LOSS_PCT = 80.0


class PathEvidence(NamedTuple):
    """One path with data in the period: ends as (node, phy, SDID), task id, loss (%), delay (raw,
    NaN = no sample) and the two verdicts."""

    src_node: str
    src_phy: int
    src_sdid: int
    dst_node: str
    dst_phy: int
    dst_sdid: int
    task_id: int
    loss: float
    delay: float
    loss_fault: bool
    delay_fault: bool

    @property
    def faulty(self) -> bool:
        """Either metric faulty."""
        return self.loss_fault or self.delay_fault


@dataclass
class Alarm:
    """One localized alarm (fields of fdol.md §8.7 plus where it is).

    ``kind``: npu | link | node | plane | superpod | switch (the last two on the RoCE plane).
    ``node``/``phy``: where it is reported (phy None for node, plane, super-pod and switch alarms;
    ``nodes`` lists the nodes of a plane, super pod or switch alarm); ``peer_node``/``peer_phy``: the other end of a link. Loss in %, delay raw.
    """

    kind: str
    super_pod_id: str
    src_id: str
    src_type: int
    dst_id: str
    dst_type: int
    fault_type: int
    level: int
    node: str
    phy: int | None = None
    peer_node: str | None = None
    peer_phy: int | None = None
    plane: int | None = None
    nodes: list[str] = field(default_factory=list)
    min_loss: float = 0.0
    max_loss: float = 0.0
    avg_loss: float = 0.0
    min_delay: float = -1.0
    max_delay: float = -1.0
    avg_delay: float = -1.0
    paths: list[tuple[int, int]] = field(default_factory=list)
    timestamp_ms: int = 0

    @property
    def key(self) -> str:
        """Suppression/identity key ``srcId-dstId-faultType-level`` (fdol.md §8.7)."""
        return f"{self.src_id}-{self.dst_id}-{self.fault_type}-{self.level}"

    @property
    def scope(self) -> str:
        """Where the alarm lies: ``inside_node`` (NPU ends on one server), ``between_nodes`` (NPU ends
        on two servers) or ``not_converged`` (a node or plane) — module doc."""
        if self.src_type == OBJ_NPU and self.dst_type == OBJ_NPU:
            src, dst = int(self.src_id), int(self.dst_id)
            return SCOPE_INSIDE_NODE if sdid_server_id(src) == sdid_server_id(dst) else SCOPE_BETWEEN_NODES
        return SCOPE_NOT_CONVERGED

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for HTTP and fault attributes); ``scope`` is :attr:`scope`."""
        return {
            "kind": self.kind,
            "superPodId": self.super_pod_id,
            "srcId": self.src_id,
            "srcType": self.src_type,
            "dstId": self.dst_id,
            "dstType": self.dst_type,
            "faultType": self.fault_type,
            "faultTypeName": FAULT_TYPE_NAMES[self.fault_type],
            "level": self.level,
            "scope": self.scope,
            "node": self.node,
            "phyId": self.phy,
            "peerNode": self.peer_node,
            "peerPhyId": self.peer_phy,
            "plane": self.plane,
            "nodes": self.nodes,
            "minLossRate": round(self.min_loss, 3),
            "maxLossRate": round(self.max_loss, 3),
            "avgLossRate": round(self.avg_loss, 3),
            "minDelay": self.min_delay,
            "maxDelay": self.max_delay,
            "avgDelay": self.avg_delay,
            "paths": len(self.paths),
            "timestamp": self.timestamp_ms,
        }


@dataclass(frozen=True)
class LocalizeParams:
    """Bounds of the layered scoring (module doc)."""

    npu_ratio: float = 0.5
    node_ratio: float = 0.5
    plane_ratio: float = 0.5
    min_npu_paths: int = 2
    min_group_paths: int = 3


def _fill_metrics(a: Alarm, paths: list[PathEvidence]) -> Alarm:
    lossy = [p.loss for p in paths if p.loss_fault]
    losses = [p.loss for p in paths]
    delays = [p.delay for p in paths if not math.isnan(p.delay)]
    if lossy:
        a.fault_type = FT_DISCONNECT if sum(lossy) / len(lossy) >= DISCONNECT_LOSS_PCT else FT_LOSS
    else:
        a.fault_type = FT_DELAY
    a.min_loss, a.max_loss, a.avg_loss = min(losses), max(losses), sum(losses) / len(losses)
    if delays:
        a.min_delay, a.max_delay = min(delays), max(delays)
        a.avg_delay = round(sum(delays) / len(delays), 3)
    a.paths = sorted({(p.src_sdid, p.dst_sdid) for p in paths})
    return a


class EvidenceTable:
    """The paths with data in one period as columns (what :func:`localize` and
    :func:`unreachable_cards` read): ``nodes`` (node names; the node columns index it), int arrays
    ``src_node``, ``src_phy``, ``src_sdid``, ``dst_node``, ``dst_phy``, ``dst_sdid``, ``task``,
    float arrays ``loss`` (%) and ``delay`` (raw, NaN = no sample), bool arrays ``loss_fault`` and
    ``delay_fault``, all of one length. :meth:`row` gives one path as :class:`PathEvidence`."""

    __slots__ = ("nodes", "src_node", "src_phy", "src_sdid", "dst_node", "dst_phy", "dst_sdid", "task",
                 "loss", "delay", "loss_fault", "delay_fault")  # fmt: skip

    def __init__(self, nodes: list[str], **cols: np.ndarray) -> None:
        self.nodes = nodes
        for name in self.__slots__[1:]:
            setattr(self, name, cols[name])

    @classmethod
    def from_list(cls, evidence: list[PathEvidence]) -> EvidenceTable:
        """The table of a list of :class:`PathEvidence`."""
        nodes = sorted({p.src_node for p in evidence} | {p.dst_node for p in evidence})
        at = {n: i for i, n in enumerate(nodes)}
        cols = list(zip(*evidence, strict=True)) if evidence else [()] * 11
        i64 = np.int64
        return cls(
            nodes,
            src_node=np.array([at[n] for n in cols[0]], dtype=i64),
            src_phy=np.array(cols[1], dtype=i64),
            src_sdid=np.array(cols[2], dtype=i64),
            dst_node=np.array([at[n] for n in cols[3]], dtype=i64),
            dst_phy=np.array(cols[4], dtype=i64),
            dst_sdid=np.array(cols[5], dtype=i64),
            task=np.array(cols[6], dtype=i64),
            loss=np.array(cols[7], dtype=float),
            delay=np.array(cols[8], dtype=float),
            loss_fault=np.array(cols[9], dtype=bool),
            delay_fault=np.array(cols[10], dtype=bool),
        )

    def __len__(self) -> int:
        return len(self.loss)

    @property
    def faulty(self) -> np.ndarray:
        """Either metric faulty, per path."""
        return self.loss_fault | self.delay_fault

    def row(self, i: int) -> PathEvidence:
        """Path ``i`` as :class:`PathEvidence`."""
        n = self.nodes
        return PathEvidence(
            n[self.src_node[i]], int(self.src_phy[i]), int(self.src_sdid[i]), n[self.dst_node[i]],
            int(self.dst_phy[i]), int(self.dst_sdid[i]), int(self.task[i]), float(self.loss[i]),
            float(self.delay[i]), bool(self.loss_fault[i]), bool(self.delay_fault[i]),
        )  # fmt: skip

    def rows(self) -> list[PathEvidence]:
        """Every path as :class:`PathEvidence`."""
        return [self.row(i) for i in range(len(self))]


def _probed(t: EvidenceTable, sp: SuperPod) -> dict[tuple, int]:
    """Paths with data touching each object (module doc, step 1), counted with numpy."""
    nn = len(t.nodes)
    width = MAX_PHY_ID + 1
    npu = np.bincount(t.src_node * width + t.src_phy, minlength=nn * width)
    npu += np.bincount(t.dst_node * width + t.dst_phy, minlength=nn * width)
    inter = t.src_node != t.dst_node
    node = np.bincount(t.src_node, minlength=nn) + np.bincount(t.dst_node[inter], minlength=nn)
    out: dict[tuple, int] = {}
    for j in np.flatnonzero(npu).tolist():
        out[("npu", t.nodes[j // width], j % width)] = int(npu[j])
    for j in np.flatnonzero(node).tolist():
        out[("node", t.nodes[j])] = int(node[j])
    uplink = np.bincount(t.src_node[inter], minlength=nn) + np.bincount(t.dst_node[inter], minlength=nn)
    for j in np.flatnonzero(uplink).tolist():
        out[("uplink", t.nodes[j])] = int(uplink[j])
    if sp.groups:
        gid = sorted(set(sp.groups.values()))
        at = {g: i for i, g in enumerate(gid)}
        g_of = np.array([at.get(sp.groups.get(n, ""), -1) for n in t.nodes], dtype=np.int64)
        gs, gd = g_of[t.src_node], g_of[t.dst_node]
        cross = (gs != gd) & (gs >= 0) & (gd >= 0)
        cnt = np.bincount(gs[cross], minlength=len(gid)) + np.bincount(gd[cross], minlength=len(gid))
        for j in np.flatnonzero(cnt).tolist():
            out[("group", gid[j])] = int(cnt[j])
        if cross.any():
            out[("switch",)] = int(cross.sum())
    if sp.planes:
        plane_at = np.full(width, -1, dtype=np.int64)
        for phy in range(width):
            pl = sp.plane_of(phy)
            if pl is not None:
                plane_at[phy] = pl
        a, b = plane_at[t.src_phy[inter]], plane_at[t.dst_phy[inter]]
        top = int(max(a.max(initial=-1), b.max(initial=-1))) + 1
        cnt = np.bincount(a[a >= 0], minlength=top) + np.bincount(b[(b >= 0) & (b != a)], minlength=top)
        for j in np.flatnonzero(cnt).tolist():
            out[("plane", j)] = int(cnt[j])
    return out


def localize(
    evidence: list[PathEvidence] | EvidenceTable,
    sp: SuperPod,
    params: LocalizeParams | None = None,
    timestamp_ms: int = 0,
) -> list[Alarm]:
    """Alarms explaining the faulty paths of ``evidence`` (all paths with data in one period, a list
    or an :class:`EvidenceTable`).

    Returns alarms sorted by (level desc, node, phy); empty when no path is faulty.
    """
    params = params or LocalizeParams()
    table = evidence if isinstance(evidence, EvidenceTable) else EvidenceTable.from_list(evidence)
    bad_idx = np.flatnonzero(table.faulty).tolist()
    if not bad_idx:
        return []
    evidence = [table.row(i) for i in bad_idx]  # only the faulty paths as objects
    bad = list(range(len(evidence)))
    plane_of = sp.plane_of if sp.planes else None
    groups = sp.groups or None
    n_groups = len(set(groups.values())) if groups else 0

    def objects(p: PathEvidence) -> set[tuple]:
        objs = {("npu", p.src_node, p.src_phy), ("npu", p.dst_node, p.dst_phy), ("node", p.src_node)}
        objs.add(("node", p.dst_node))
        if p.src_node != p.dst_node:
            objs.update((("uplink", p.src_node), ("uplink", p.dst_node)))
        if groups is not None:
            a, b = groups.get(p.src_node), groups.get(p.dst_node)
            if a is not None and b is not None and a != b:
                objs.update((("group", a), ("group", b), ("switch",)))
        if plane_of is not None and p.src_node != p.dst_node:
            for phy in (p.src_phy, p.dst_phy):
                pl = plane_of(phy)
                if pl is not None:
                    objs.add(("plane", pl))
        return objs

    probed = _probed(table, sp)
    bad_objs = {i: objects(evidence[i]) for i in bad}
    remaining = set(bad)
    alarms: list[Alarm] = []
    n_nodes = len(sp.nodes)
    while remaining:
        hits: dict[tuple, list[int]] = {}
        for i in remaining:
            for o in bad_objs[i]:
                hits.setdefault(o, []).append(i)
        best = None
        cands: list[tuple] = []
        for obj, hit in hits.items():
            ratio = len(hit) / probed[obj]
            kind = obj[0]
            if kind == "npu":
                ok = ratio >= params.npu_ratio and len(hit) >= params.min_npu_paths
            elif kind in ("node", "uplink"):
                npus = {
                    (evidence[i].src_node, evidence[i].src_phy) for i in hit if evidence[i].src_node == obj[1]
                }
                npus |= {
                    (evidence[i].dst_node, evidence[i].dst_phy) for i in hit if evidence[i].dst_node == obj[1]
                }
                ok = ratio >= params.node_ratio and len(hit) >= params.min_group_paths and len(npus) >= 2
            elif kind in ("group", "switch"):
                spanned = {groups[evidence[i].src_node] for i in hit} | {
                    groups[evidence[i].dst_node] for i in hit
                }
                ok = (
                    n_groups >= 3  # with two super pods a dead one and a dead switch look the same
                    and ratio >= params.plane_ratio
                    and len(hit) >= params.min_group_paths
                    and len(spanned) >= (3 if kind == "switch" else 2)
                )
            else:
                spanned = {evidence[i].src_node for i in hit} | {evidence[i].dst_node for i in hit}
                ok = (
                    ratio >= params.plane_ratio
                    and len(hit) >= params.min_group_paths
                    and len(spanned) >= min(3, n_nodes)
                )
            if not ok:
                continue
            score = (math.floor(ratio * 20 + 1e-9), len(hit), _KIND_RANK[kind], obj)
            cands.append((score, obj, hit, ratio))
            if best is None or score > best[0]:
                best = (score, obj, sorted(hit), ratio)
        if best is None:
            break
        # a wider object (a plane, super pod or the switch over an NPU or node) within 10 % of the best
        # ratio that explains 3x its paths wins: a few of a group's paths under the threshold in
        # one period must not split the group into its members
        wider = [
            c
            for c in cands
            if c[0][2] > best[0][2] and c[3] >= best[3] - 0.1 and len(c[2]) >= 3 * len(best[2])
        ]
        if wider:
            w = max(wider, key=lambda c: (len(c[2]), c[0]))
            best = (w[0], w[1], sorted(w[2]), w[3])
        _, obj, hit, _ = best
        remaining.difference_update(hit)
        ev = [evidence[i] for i in hit]
        if obj[0] == "npu":
            _, node, phy = obj
            sdid = sp.nodes[node].devices[phy]
            a = Alarm("npu", sp.super_pod_id, str(sdid), OBJ_NPU, str(sdid), OBJ_NPU, 0, LV_MAJOR, node, phy)
        elif obj[0] in ("node", "uplink"):
            node = obj[1]
            a = Alarm("node", sp.super_pod_id, node, OBJ_NODE, node, OBJ_NODE, 0, LV_CRITICAL, node)
        elif obj[0] == "group":
            gid = f"SuperPod-{obj[1]}"
            nodes = sorted(n for n, g in groups.items() if g == obj[1])
            a = Alarm(
                "superpod", sp.super_pod_id, gid, OBJ_SUPER_POD, gid, OBJ_SUPER_POD, 0, LV_CRITICAL, nodes[0]
            )
            a.nodes = nodes
        elif obj[0] == "switch":
            nodes = sorted({p.src_node for p in ev} | {p.dst_node for p in ev})
            a = Alarm("switch", sp.super_pod_id, "ROCESwitch", OBJ_ROCE_SWITCH, "ROCESwitch", OBJ_ROCE_SWITCH, 0,
                      LV_CRITICAL, nodes[0])  # fmt: skip
            a.nodes = nodes
        else:
            pid = f"plane-{obj[1]}"
            nodes = sorted({p.src_node for p in ev} | {p.dst_node for p in ev})
            a = Alarm("plane", sp.super_pod_id, pid, OBJ_PLANE, pid, OBJ_PLANE, 0, LV_CRITICAL, nodes[0])
            a.plane = obj[1]
            a.nodes = nodes
        alarms.append(_fill_metrics(a, ev))
    links: dict[tuple[int, int], list[PathEvidence]] = {}
    for i in sorted(remaining, key=lambda i: (evidence[i].src_sdid, evidence[i].dst_sdid)):
        p = evidence[i]
        links.setdefault((min(p.src_sdid, p.dst_sdid), max(p.src_sdid, p.dst_sdid)), []).append(p)
    for (lo, hi), ev in links.items():
        n1, p1 = sp.locate(lo) or (ev[0].src_node, ev[0].src_phy)
        n2, p2 = sp.locate(hi) or (ev[0].dst_node, ev[0].dst_phy)
        a = Alarm("link", sp.super_pod_id, str(lo), OBJ_NPU, str(hi), OBJ_NPU, 0, LV_MINOR, n1, p1, n2, p2)
        alarms.append(_fill_metrics(a, ev))
    for a in alarms:
        a.timestamp_ms = timestamp_ms
    alarms.sort(key=lambda a: (-a.level, a.node, -1 if a.phy is None else a.phy, a.dst_id))
    return alarms


def unreachable_cards(evidence: list[PathEvidence] | EvidenceTable) -> list[tuple[str, int]]:
    """Source cards (node, phy) for which every probed destination lost every packet in the period
    (noded.md §6: a card is faulty when no destination answers). Sorted."""
    t = evidence if isinstance(evidence, EvidenceTable) else EvidenceTable.from_list(evidence)
    width = MAX_PHY_ID + 1
    card = t.src_node * width + t.src_phy
    size = len(t.nodes) * width
    alive = np.bincount(card[t.loss < 100.0 - 1e-6], minlength=size)
    seen = np.bincount(card, minlength=size)
    return sorted(
        (t.nodes[j // width], j % width) for j in np.flatnonzero((seen > 0) & (alive == 0)).tolist()
    )


def evidence_arrays(evidence: list[PathEvidence]) -> dict[str, np.ndarray]:
    """Loss and delay of the evidence as arrays (for summaries)."""
    return {
        "loss": np.array([p.loss for p in evidence]),
        "delay": np.array([p.delay for p in evidence]),
        "fault": np.array([p.faulty for p in evidence], dtype=bool),
    }
