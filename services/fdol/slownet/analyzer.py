"""One super pod's slow-network analysis per period: rows -> window -> verdicts -> alarms -> detections.

Source: reference fdol.md §8.5–§8.8 (period loop, window, localization, suppression) and noded.md §6
(a card no destination reaches). The output is :class:`SlowNetDetection` records — what is blamed,
where, since when — with no fault code or level: the service raising faults maps each detection's
``scope`` to its code and level (clusterd's FD-OL edge).

Lifecycle of an alarm (faultmesh; the reference only emits one-shot alarms): an alarm is *active*
from the first period it is localized; it *recovers* after ``recover_periods`` (2) consecutive
periods in which it is not localized while at least one of its paths had data; it is dropped as
*stale* after ``stale_periods`` (6) periods without any data on its paths (a node that stops
reporting is neither a fault nor a proof of health for long). Suppression (fdol.md §8.7) applies to
the per-period alarm emissions (log lines, history), not to the fault state.

Rows are checked against the topology and the ping list: an address that is not an SDID of the
super pod (``unknown_address``) or a pair that is not in the ping list (``not_in_ping_list``) is
counted and skipped, like the window's own checks (:func:`fdol.slownet.window.row_problem`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fdol.slownet.localize import (
    SCOPE_CARD_UNREACHABLE,
    Alarm,
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
    detection per node of the plane). ``scope``: :data:`fdol.slownet.localize.SCOPES` (inside_node,
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
    loss_abs_pct: float | None = 20.0
    delay_abs: float | None = None
    recover_periods: int = 2
    stale_periods: int = 6
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
    """What one :meth:`SuperPodAnalyzer.analyze` call found."""

    period: int
    alarms: list[Alarm]
    occurred: list[str]
    recovered: list[str]
    emitted: list[Alarm]
    suppressed: int
    unreachable: list[tuple[str, int]]
    faulty_paths: int
    paths_with_data: int


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
            loss_abs_pct=p.loss_abs_pct,
            delay_abs=p.delay_abs,
        )
        self.suppressor = Suppressor(p.suppress_s)
        self.active: dict[str, Active] = {}
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
        # caches (rebuilt on topology change): address pair -> verdict, window path index -> ends
        self._pair_check: dict[tuple[str, str], str | None] = {}
        self._meta: dict[int, tuple[str, int, int, str, int, int] | None] = {}

    # -- input ---------------------------------------------------------------------------------
    def ingest(self, rows: Iterable[PingRow], now_ms: int | None = None) -> dict[str, int]:
        """Check rows against topology and ping list, then add them to the window. Returns counts
        (``accepted`` and skip reasons); skipped rows are also summed in ``rejected``."""
        ok: list[PingRow] = []
        counts: dict[str, int] = {}
        check = self._pair_check
        for r in rows:
            key = (r.src_addr, r.dst_addr)
            why = check.get(key, "")
            if why == "":
                why = check[key] = self._check_pair(key)
            if why is None:
                ok.append(r)
            else:
                counts[why] = counts.get(why, 0) + 1
        for k, v in self.window.add(ok, now_ms).items():
            counts[k] = counts.get(k, 0) + v
        for k, v in counts.items():
            if k != "accepted":
                self.rejected[k] = self.rejected.get(k, 0) + v
        return counts

    def _check_pair(self, key: tuple[str, str]) -> str | None:
        try:
            pair = (int(key[0]), int(key[1]))
        except ValueError:
            return "unknown_address"
        if self.sp.locate(pair[0]) is None or self.sp.locate(pair[1]) is None:
            return "unknown_address"
        return None if pair in self.expected else "not_in_ping_list"

    def _ends(self, i: int) -> tuple[str, int, int, str, int, int] | None:
        if i in self._meta:
            return self._meta[i]
        key = self.window.keys[i]
        m = None
        if self._check_pair((key[2], key[4])) is None:
            s, d = int(key[2]), int(key[4])
            a, b = self.sp.locate(s), self.sp.locate(d)
            m = (a[0], a[1], s, b[0], b[1], d)
        self._meta[i] = m
        return m

    # -- one period ------------------------------------------------------------------------------
    def evidence(self, period: int) -> list[PathEvidence]:
        """Verdicts of ``period`` as :class:`PathEvidence` (paths still in the topology only)."""
        res = self.window.evaluate(period)
        out = []
        keys = self.window.keys
        loss, delay = res.loss.tolist(), res.delay.tolist()
        lf, df = res.loss_fault.tolist(), res.delay_fault.tolist()
        for j, i in enumerate(res.idx.tolist()):
            m = self._ends(i)
            if m is None:
                continue
            out.append(
                PathEvidence(m[0], m[1], m[2], m[3], m[4], m[5], keys[i][0], loss[j], delay[j], lf[j], df[j])
            )
        return out

    def analyze(self, period: int, now_s: float | None = None) -> PeriodReport:
        """Evaluate ``period`` (the newest complete one), localize, update alarm lifecycles.

        ``now_s`` is the suppression clock (defaults to the period's end time in s).
        """
        p = self.params
        end_ms = (period + 1) * p.period_ms
        now_s = end_ms / 1000 if now_s is None else now_s
        ev = self.evidence(period)
        alarms = localize(ev, self.sp, p.localize, timestamp_ms=end_ms)
        with_data = {(e.src_sdid, e.dst_sdid) for e in ev}
        occurred, recovered, emitted = [], [], []
        seen = set()
        for a in alarms:
            ident = f"{a.kind}:{a.src_id}-{a.dst_id}"
            seen.add(ident)
            cur = self.active.get(ident)
            if cur is None:
                self.active[ident] = Active(a, end_ms, end_ms, frozenset(a.paths))
                occurred.append(ident)
            else:
                cur.alarm, cur.last_ms, cur.clean, cur.missing = a, end_ms, 0, 0
                cur.paths = cur.paths | frozenset(a.paths)
            if self.suppressor.admit(a.key, now_s):
                emitted.append(a)
        for ident in [i for i in self.active if i not in seen]:
            if self._age(self.active[ident], with_data):
                del self.active[ident]
                recovered.append(ident)
        dead = unreachable_cards(ev)
        src_with_data = {(e.src_node, e.src_phy) for e in ev}
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
            sum(e.faulty for e in ev), len(ev),
        )  # fmt: skip
        self.last_report = report
        self.last_summary = self._summary(period, ev)
        return report

    def _age(self, cur: Active, with_data: set[tuple[int, int]]) -> bool:
        if cur.paths & with_data:
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
                put(a.node, "Node", -1, a.scope, cur, d, f"node {a.node} unreachable on HCCS")
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

    def _summary(self, period: int, ev: list[PathEvidence]) -> dict[str, Any]:
        matrix: dict[tuple[str, str], list[float]] = {}
        for e in ev:
            m = matrix.setdefault((e.src_node, e.dst_node), [0, 0, 0.0, 0.0, 0])
            m[0] += 1
            m[1] += e.faulty
            m[2] += e.loss
            if not math.isnan(e.delay):
                m[3] += e.delay
                m[4] += 1
        losses = np.array([e.loss for e in ev]) if ev else np.zeros(0)
        delays = np.array([e.delay for e in ev if not math.isnan(e.delay)]) if ev else np.zeros(0)
        worst = heapq.nsmallest(
            10, ev, key=lambda e: (-e.faulty, -e.loss, -(0 if math.isnan(e.delay) else e.delay))
        )
        return {
            "period": period,
            "periodEndMs": (period + 1) * self.params.period_ms,
            "paths": len(self.expected),
            "pathsWithData": len(ev),
            "faultyPaths": int(sum(e.faulty for e in ev)),
            "avgLossRate": round(float(losses.mean()), 3) if len(losses) else None,
            "maxLossRate": round(float(losses.max()), 3) if len(losses) else None,
            "avgDelay": round(float(delays.mean()), 3) if len(delays) else None,
            "maxDelay": round(float(delays.max()), 3) if len(delays) else None,
            "matrix": [
                {
                    "srcNode": s,
                    "dstNode": d,
                    "paths": int(m[0]),
                    "faultyPaths": int(m[1]),
                    "avgLossRate": round(m[2] / m[0], 3),
                    "avgDelay": round(m[3] / m[4], 3) if m[4] else None,
                }
                for (s, d), m in sorted(matrix.items())
            ],
            "worstPaths": [
                {
                    "src": f"{e.src_node}/{e.src_phy}",
                    "dst": f"{e.dst_node}/{e.dst_phy}",
                    "lossRate": round(e.loss, 3),
                    "delay": None if math.isnan(e.delay) else round(e.delay, 3),
                    "faulty": e.faulty,
                }
                for e in worst
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
