"""One super pod's slow-network analysis per period: rows -> window -> verdicts -> alarms -> detections.

Source: reference fdol.md §8.5–§8.8 (period loop, window, localization, suppression) and noded.md §6
(a card no destination reaches). The output is :class:`SlowNetDetection` records — what is blamed,
where, since when — with no fault code or level: the service raising faults maps each detection's
``scope`` to its code and level (clusterd's FD-OL edge).

Lifecycle of an alarm (faultmesh; the reference only emits one-shot alarms): an alarm is *pending*
until it is *confirmed* — localized in ``confirm_periods`` (2) consecutive periods, or at once on
strong evidence, or in one period more for a link faulty one way only
(:meth:`SuperPodAnalyzer._periods_needed`); a confirmed alarm is *active* from that period; it *recovers* after ``recover_periods`` (2) consecutive
periods in which it is not localized while at least one of its paths had data; it is dropped as
*stale* after ``stale_periods`` (6) periods without any data on its paths (a node that stops
reporting is neither a fault nor a proof of health for long). Suppression (fdol.md §8.7) applies to
the per-period alarm emissions (log lines, history), not to the fault state.

Rows are checked against the topology and the ping list: an address that is not an SDID of the
super pod (``unknown_address``) or a pair that is not in the ping list (``not_in_ping_list``) is
counted and skipped, like the window's own checks (:func:`fdol.slownet.window.row_problem`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fdol.slownet.localize import (
    FT_DELAY,
    SCOPE_CARD_UNREACHABLE,
    Alarm,
    EvidenceTable,
    LocalizeParams,
    PathEvidence,
    localize,
    unreachable_cards,
)
from fdol.slownet.pinglist import PingPair
from fdol.slownet.suppress import Suppressor
from fdol.slownet.topology import SuperPod
from fdol.slownet.window import PathWindow, PingRow


@dataclass(frozen=True)
class SlowNetDetection:
    """One thing the analysis currently blames (an active alarm, or several merged on one place).

    ``node``/``device_type``/``device_id``: where it lies — ``"NPU"`` and the phy id (an NPU, one end
    of a link, an unreachable card), ``"Node"`` and -1 (a node), ``"Plane"`` and the plane id (one
    detection per node of the plane); on the RoCE plane also ``"SuperPod"`` and its id (one per
    probing node of the super pod) and ``"Switch"`` and -1 (one per node of the alarm). ``scope``: :data:`fdol.slownet.localize.SCOPES` (inside_node,
    between_nodes, not_converged, card_unreachable). ``first_ms``/``last_ms``: first and last period
    end (ms since the epoch) it was localized in. ``alarms``: :meth:`Alarm.to_dict` of the merged
    alarms sorted by (srcId, dstId) — they name the NPUs and links (empty for an unreachable card).
    """

    super_pod_id: str
    node: str
    device_type: str
    device_id: int
    scope: str
    first_ms: int
    last_ms: int
    description: str
    alarms: tuple[dict[str, Any], ...] = ()

    @property
    def key(self) -> tuple[str, str, int, str]:
        """(node, device type, device id, scope): one detection per key."""
        return (self.node, self.device_type, self.device_id, self.scope)

    @property
    def fault_types(self) -> tuple[str, ...]:
        """Sorted distinct fault type names (delay, loss, disconnect) of the alarms."""
        return tuple(sorted({a["faultTypeName"] for a in self.alarms}))


@dataclass(frozen=True)
class AnalyzerParams:
    """Window, lifecycle and localization settings (units: ms for the period, s for suppression)."""

    period_ms: int = 10_000
    periods: int = 10
    baseline_periods: int = 8
    min_baseline: int = 3
    sigma: float = 3.0
    std_floor: float = 1.0
    delay_rel_floor: float = 0.15
    loss_abs_pct: float | None = 20.0
    delay_abs: float | None = None
    recover_periods: int = 2
    stale_periods: int = 6
    confirm_periods: int = 2
    suppress_s: float = 0.0
    localize: LocalizeParams = field(default_factory=LocalizeParams)


@dataclass
class Active:
    """An active alarm (or unreachable card) and its lifecycle counters (times in ms)."""

    alarm: Alarm | None
    first_ms: int
    last_ms: int
    paths: frozenset[tuple[int, int]]
    clean: int = 0
    missing: int = 0


@dataclass
class PeriodReport:
    """What one :meth:`SuperPodAnalyzer.analyze` call found: ``alarms`` the confirmed alarms
    localized in the period (active ones), ``pending`` those localized but not confirmed yet
    (module doc)."""

    period: int
    alarms: list[Alarm]
    occurred: list[str]
    recovered: list[str]
    emitted: list[Alarm]
    suppressed: int
    unreachable: list[tuple[str, int]]
    faulty_paths: int
    paths_with_data: int
    pending: list[Alarm] = field(default_factory=list)


class _LazyPairs:
    """The (src SDID, dst SDID) pairs with data in a period, built only when first asked."""

    def __init__(self, ev: EvidenceTable) -> None:
        self.ev = ev
        self._set: set[tuple[int, int]] | None = None

    def any_of(self, pairs: frozenset[tuple[int, int]]) -> bool:
        """True when one of ``pairs`` had data."""
        if self._set is None:
            self._set = set(zip(self.ev.src_sdid.tolist(), self.ev.dst_sdid.tolist(), strict=True))
        return not self._set.isdisjoint(pairs)


def _src_cards(ev: EvidenceTable) -> set[tuple[str, int]]:
    """(node, phy) of every source card with data."""
    width = 64
    return {(ev.nodes[j // width], j % width) for j in np.unique(ev.src_node * width + ev.src_phy).tolist()}


class SuperPodAnalyzer:
    """Analysis state of one super pod. Not thread-safe (one owner).

    ``sp``: topology; ``pairs``: its ping list (:func:`fdol.slownet.pinglist.generate`).
    """

    def __init__(self, sp: SuperPod, pairs: list[PingPair], params: AnalyzerParams | None = None) -> None:
        self.params = params or AnalyzerParams()
        p = self.params
        self.window = PathWindow(
            p.period_ms,
            periods=p.periods,
            baseline_periods=p.baseline_periods,
            min_baseline=p.min_baseline,
            sigma=p.sigma,
            std_floor=p.std_floor,
            delay_rel_floor=p.delay_rel_floor,
            loss_abs_pct=p.loss_abs_pct,
            delay_abs=p.delay_abs,
        )
        self.suppressor = Suppressor(p.suppress_s)
        self.active: dict[str, Active] = {}
        self.pending: dict[str, int] = {}  # unconfirmed alarm -> consecutive periods localized
        self.cards: dict[tuple[str, int], Active] = {}
        self.rejected: dict[str, int] = {}
        self.last_report: PeriodReport | None = None
        self.last_summary: dict[str, Any] = {}
        self.set_topology(sp, pairs)

    def set_topology(self, sp: SuperPod, pairs: list[PingPair]) -> None:
        """Replace topology and ping list (alarms and window stay; paths no longer listed age out)."""
        self.sp = sp
        self.pairs = pairs
        self.expected = {(p.src_sdid, p.dst_sdid) for p in pairs}
        # caches (rebuilt on topology change): address pair -> verdict, and per window path index
        # its ends as columns (node index into _node_names, phy, SDID; src node -1 = not a path of
        # this topology any more)
        self._pair_check: dict[tuple[str, str], str | None] = {}
        self.window.set_gate(lambda key: self._check_pair((key[2], key[4])))
        self._node_names = sorted(sp.nodes)
        self._node_at = {n: i for i, n in enumerate(self._node_names)}
        self._meta = np.zeros((7, 0), dtype=np.int64)

    # -- input ---------------------------------------------------------------------------------
    def ingest(self, rows: Iterable[PingRow], now_ms: int | None = None) -> dict[str, int]:
        """Check rows against topology and ping list (``unknown_address``, ``not_in_ping_list``),
        then add them to the window. Returns counts (``accepted`` and skip reasons); skipped rows
        are also summed in ``rejected``."""
        counts = self.window.add(rows, now_ms)
        for k, v in counts.items():
            if k != "accepted":
                self.rejected[k] = self.rejected.get(k, 0) + v
        return counts

    def _check_pair(self, key: tuple[str, str]) -> str | None:
        why = self._pair_check.get(key, "")
        if why == "":
            why = self._pair_check[key] = self._pair_verdict(key)
        return why

    def _pair_verdict(self, key: tuple[str, str]) -> str | None:
        try:
            pair = (int(key[0]), int(key[1]))
        except ValueError:
            return "unknown_address"
        if self.sp.locate(pair[0]) is None or self.sp.locate(pair[1]) is None:
            return "unknown_address"
        return None if pair in self.expected else "not_in_ping_list"

    def _path_meta(self) -> np.ndarray:
        """Ends of every window path as a (7, paths) array: src node, src phy, src SDID, dst node,
        dst phy, dst SDID, task id (src node -1: not a path of the current topology). Extended for
        new paths."""
        keys = self.window.keys
        have = self._meta.shape[1]
        if have < len(keys):
            add = np.zeros((7, len(keys) - have), dtype=np.int64)
            for j, key in enumerate(keys[have:]):
                add[0, j] = -1
                if self._check_pair((key[2], key[4])) is None:
                    s, d = int(key[2]), int(key[4])
                    (an, ap), (bn, bp) = self.sp.locate(s), self.sp.locate(d)
                    add[:, j] = (self._node_at[an], ap, s, self._node_at[bn], bp, d, key[0])
            self._meta = np.concatenate([self._meta, add], axis=1)
        return self._meta

    # -- one period ------------------------------------------------------------------------------
    def evidence_table(self, period: int) -> EvidenceTable:
        """Verdicts of ``period`` as an :class:`EvidenceTable` (paths still in the topology only)."""
        res = self.window.evaluate(period)
        meta = self._path_meta()
        idx = res.idx
        m = meta[:, idx]
        keep = m[0] >= 0
        m = m[:, keep]
        return EvidenceTable(
            self._node_names, src_node=m[0], src_phy=m[1], src_sdid=m[2], dst_node=m[3], dst_phy=m[4],
            dst_sdid=m[5], task=m[6], loss=res.loss[keep], delay=res.delay[keep],
            loss_fault=res.loss_fault[keep], delay_fault=res.delay_fault[keep],
        )  # fmt: skip

    def evidence(self, period: int) -> list[PathEvidence]:
        """Verdicts of ``period`` as :class:`PathEvidence` (paths still in the topology only)."""
        return self.evidence_table(period).rows()

    def analyze(self, period: int, now_s: float | None = None) -> PeriodReport:
        """Evaluate ``period`` (the newest complete one), localize, update alarm lifecycles.

        ``now_s`` is the suppression clock (defaults to the period's end time in s).
        """
        p = self.params
        end_ms = (period + 1) * p.period_ms
        now_s = end_ms / 1000 if now_s is None else now_s
        ev = self.evidence_table(period)
        alarms = localize(ev, self.sp, p.localize, timestamp_ms=end_ms)
        with_data = _LazyPairs(ev)
        occurred, recovered, emitted = [], [], []
        seen = set()
        confirmed, pending, still = [], [], {}
        for a in alarms:
            ident = f"{a.kind}:{a.src_id}-{a.dst_id}"
            cur = self.active.get(ident)
            if cur is None:
                n = self.pending.get(ident, 0) + 1
                if n < self._periods_needed(a, with_data):
                    still[ident] = n
                    pending.append(a)
                    continue
                self.active[ident] = Active(a, end_ms, end_ms, frozenset(a.paths))
                occurred.append(ident)
            else:
                cur.alarm, cur.last_ms, cur.clean, cur.missing = a, end_ms, 0, 0
                cur.paths = cur.paths | frozenset(a.paths)
            seen.add(ident)
            confirmed.append(a)
            if self.suppressor.admit(a.key, now_s):
                emitted.append(a)
        self.pending = still
        alarms = confirmed
        for ident in [i for i in self.active if i not in seen]:
            if self._age(self.active[ident], with_data):
                del self.active[ident]
                recovered.append(ident)
        dead = unreachable_cards(ev) if not self.sp.groups else []  # an HCCS card rule (noded.md §6)
        src_with_data = _src_cards(ev) if self.cards else set()
        for card in dead:
            cur = self.cards.get(card)
            if cur is None:
                self.cards[card] = Active(None, end_ms, end_ms, frozenset())
                occurred.append(f"card:{card[0]}/{card[1]}")
            else:
                cur.last_ms, cur.clean, cur.missing = end_ms, 0, 0
        for card in [c for c in self.cards if c not in set(dead)]:
            cur = self.cards[card]
            if card in src_with_data:
                cur.clean += 1
                cur.missing = 0
            else:
                cur.missing += 1
            if cur.clean >= p.recover_periods or cur.missing >= p.stale_periods:
                del self.cards[card]
                recovered.append(f"card:{card[0]}/{card[1]}")
        report = PeriodReport(
            period, alarms, occurred, recovered, emitted, len(alarms) - len(emitted), dead,
            int(ev.faulty.sum()), len(ev), pending,
        )  # fmt: skip
        self.last_report = report
        self.last_summary = self._summary(period, ev)
        return report

    def _periods_needed(self, a: Alarm, with_data: _LazyPairs) -> int:
        """Consecutive periods an alarm must be localized in before it is confirmed: 1 on strong
        evidence — loss on a group (NPU, node, plane: several lossy paths share the object), a link
        lossy both ways (a ping is a round trip, so a real link fault shows in both directions; one
        path's loss burst does not), or a link lossy at the absolute bound whose way back is not
        probed; one more than ``confirm_periods`` for a link faulty one way while its way back is
        probed and clean; ``confirm_periods`` otherwise (delay alarms: queueing under load moves
        delays for a period)."""
        need = self.params.confirm_periods
        lossy = a.fault_type != FT_DELAY
        if a.kind != "link":
            return 1 if lossy else need
        pairs = set(a.paths)
        if any((d, s) in pairs for s, d in pairs):
            return 1 if lossy else need
        if with_data.any_of(frozenset((d, s) for s, d in pairs)):
            return need + 1  # one way only while the way back is probed and clean: a burst or an outlier
        bound = self.params.loss_abs_pct
        return 1 if lossy and bound is not None and a.avg_loss >= bound else need

    def _age(self, cur: Active, with_data: _LazyPairs) -> bool:
        if with_data.any_of(cur.paths):
            cur.clean += 1
            cur.missing = 0
        else:
            cur.missing += 1
        return cur.clean >= self.params.recover_periods or cur.missing >= self.params.stale_periods

    # -- output ----------------------------------------------------------------------------------
    def detections(self, node_filter: set[str] | None = None) -> list[SlowNetDetection]:
        """What the active alarms and unreachable cards blame, one :class:`SlowNetDetection` per
        (node, device type, device id, scope) — several alarms on one place are merged. Sorted by key;
        ``node_filter`` keeps only those nodes."""
        merged: dict[tuple[str, str, int, str], dict[str, Any]] = {}

        def put(node: str, dtype: str, did: int, scope: str, cur: Active, alarm: dict | None, desc: str):
            m = merged.setdefault(
                (node, dtype, did, scope),
                {"first": cur.first_ms, "last": cur.last_ms, "alarms": [], "desc": []},
            )
            m["first"] = min(m["first"], cur.first_ms)
            m["last"] = max(m["last"], cur.last_ms)
            if alarm is not None:
                m["alarms"].append(alarm)
            m["desc"].append(desc)

        for cur in self.active.values():
            a = cur.alarm
            assert a is not None
            d = a.to_dict()
            if a.kind == "npu":
                put(a.node, "NPU", a.phy, a.scope, cur, d, f"NPU {a.node}/{a.phy} network fault")
            elif a.kind == "link":
                desc = f"link {a.node}/{a.phy} <-> {a.peer_node}/{a.peer_phy}"
                put(a.node, "NPU", a.phy, a.scope, cur, d, desc)
            elif a.kind == "node":
                net = "RoCE" if self.sp.groups else "HCCS"
                put(a.node, "Node", -1, a.scope, cur, d, f"node {a.node} unreachable on {net}")
            elif a.kind == "superpod":
                spid = a.src_id.removeprefix("SuperPod-")
                did = int(spid) if spid.isdigit() else -1
                for n in a.nodes:
                    put(n, "SuperPod", did, a.scope, cur, d, f"super pod {spid} RoCE uplink degraded")
            elif a.kind == "switch":
                for n in a.nodes:
                    put(n, "Switch", -1, a.scope, cur, d, "RoCE switch degraded")
            else:
                for n in a.nodes:
                    put(n, "Plane", a.plane, a.scope, cur, d, f"switch plane {a.plane} degraded")
        for (node, phy), cur in self.cards.items():
            put(node, "NPU", phy, SCOPE_CARD_UNREACHABLE, cur, None, "hccsping-mesh fault")
        return [
            SlowNetDetection(
                self.sp.super_pod_id,
                node,
                dtype,
                did,
                scope,
                m["first"],
                m["last"],
                "; ".join(sorted(set(m["desc"]))),
                tuple(sorted(m["alarms"], key=lambda x: (x["srcId"], x["dstId"]))),
            )  # fmt: skip
            for (node, dtype, did, scope), m in sorted(merged.items())
            if node_filter is None or node in node_filter
        ]

    def _summary(self, period: int, ev: EvidenceTable) -> dict[str, Any]:
        n = len(ev)
        names = ev.nodes
        nn = len(names)
        has_d = ~np.isnan(ev.delay)
        fault = ev.faulty
        pair = ev.src_node * nn + ev.dst_node
        size = nn * nn
        paths = np.bincount(pair, minlength=size)
        faulty = np.bincount(pair, fault, minlength=size)
        loss_sum = np.bincount(pair, ev.loss, minlength=size)
        d_sum = np.bincount(pair[has_d], ev.delay[has_d], minlength=size)
        d_cnt = np.bincount(pair[has_d], minlength=size)
        delay0 = np.where(has_d, ev.delay, 0.0)
        worst = np.lexsort((-delay0, -ev.loss, -fault.astype(np.int8)))[:10].tolist()
        nz = np.flatnonzero(paths)
        m_paths, m_faulty = paths[nz].tolist(), faulty[nz].tolist()
        m_loss = np.round(loss_sum[nz] / paths[nz], 3).tolist()
        m_dcnt = d_cnt[nz].tolist()
        m_delay = np.round(d_sum[nz] / np.maximum(d_cnt[nz], 1), 3).tolist()
        return {
            "period": period,
            "periodEndMs": (period + 1) * self.params.period_ms,
            "paths": len(self.expected),
            "pathsWithData": n,
            "faultyPaths": int(fault.sum()),
            "avgLossRate": round(float(ev.loss.mean()), 3) if n else None,
            "maxLossRate": round(float(ev.loss.max()), 3) if n else None,
            "avgDelay": round(float(ev.delay[has_d].mean()), 3) if has_d.any() else None,
            "maxDelay": round(float(ev.delay[has_d].max()), 3) if has_d.any() else None,
            "matrix": [
                {
                    "srcNode": names[j // nn],
                    "dstNode": names[j % nn],
                    "paths": m_paths[x],
                    "faultyPaths": int(m_faulty[x]),
                    "avgLossRate": m_loss[x],
                    "avgDelay": m_delay[x] if m_dcnt[x] else None,
                }
                for x, j in enumerate(nz.tolist())
            ],
            "worstPaths": [
                {
                    "src": f"{names[ev.src_node[i]]}/{int(ev.src_phy[i])}",
                    "dst": f"{names[ev.dst_node[i]]}/{int(ev.dst_phy[i])}",
                    "lossRate": round(float(ev.loss[i]), 3),
                    "delay": None if not has_d[i] else round(float(ev.delay[i]), 3),
                    "faulty": bool(fault[i]),
                }
                for i in worst
            ],
        }

    def status(self) -> dict[str, Any]:
        """The super pod's status for ``GET /v1/pingmesh``: latest matrix summary, open alarms,
        unreachable cards, skipped-row counts."""
        return {
            "superPodId": self.sp.super_pod_id,
            "nodes": len(self.sp.nodes),
            "npus": self.sp.npu_count,
            "periodMs": self.params.period_ms,
            "latest": self.last_summary,
            "alarms": [
                {**cur.alarm.to_dict(), "firstSeenMs": cur.first_ms, "lastSeenMs": cur.last_ms}
                for _, cur in sorted(self.active.items())
                if cur.alarm is not None
            ],
            "unreachableCards": [
                {"node": n, "phyId": p, "firstSeenMs": cur.first_ms}
                for (n, p), cur in sorted(self.cards.items())
            ],
            "rejectedRows": dict(sorted(self.rejected.items())),
            "suppressedAlarms": self.suppressor.suppressed,
        }
