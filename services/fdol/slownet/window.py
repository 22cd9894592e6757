"""Sliding window of detection periods per path key, and the mean + 3·max(std, 1) thresholds.

Source: reference fdol.md §8.6. Units: loss in percent (the CSV's fraction x 100), delay in the
driver's raw unit (hccsping ``avg_time``; faultmesh's simulator uses microseconds), periods of
``period_ms`` milliseconds, row timestamps in ms since the epoch. Path key =
``(pingTaskId, srcType, srcAddr, dstType, dstAddr)``.

Arithmetic: a row belongs to period ``k = timestamp_ms // period_ms``. Each period holds, per path,
the mean of that period's rows (several rows of one path in one period are averaged). The window
keeps ``periods`` (10) periods: :meth:`PathWindow.evaluate` of period ``k`` (the newest complete
period; ``k + 1`` is still filling) uses the ``baseline_periods`` (8) periods ``k-8 .. k-1`` as the
baseline: ``threshold = mean + sigma * max(popstd, std_floor)`` over the baseline periods that have
data; a metric is faulty when the period-``k`` value reaches the threshold. Delay ``-1`` (ping
failed) is no delay sample.

Deliberate differences from the reference (design.md; each named here):
- exact population statistics over per-period means (no double counting of baseline rows);
- a period in which a path was faulty is left out of that path's later baselines, and a path with
  fewer than ``min_baseline`` clean baseline periods keeps its last clean baseline — so a fault
  that persists is not absorbed into its own baseline and stays detected until it really recovers;
- the delay's std floor can grow with the path's baseline delay (``delay_rel_floor`` x mean; the
  analyzer sets 0.15): eight
  periods underestimate the spread of a heavy-tailed RTT (user-space RoCE pings), and a path whose
  jittery periods were flagged would otherwise tighten its own threshold;
- an absolute bound: a loss of ``loss_abs_pct`` (20 %) or more (and a delay of ``delay_abs`` or
  more, when set) is faulty whatever the baseline, so a link that is lossy from the first period is
  still found (the reference never flags it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

PathKey = tuple[int, str, str, str, str]

MAX_DELAY = 10_000_000.0  # 10 s in µs: anything above is an absurd delay
FUTURE_SLACK_MS = 60_000
_ROW_FIELDS = 10  # PingRow's fields
_KEY = itemgetter(0, 1, 2, 3, 4)  # a row's PathKey
_REASONS = ("", "address", "loss_range", "delay_range", "timestamp", "future", "late")


class PingRow(NamedTuple):
    """One pingmesh result row (a ``ping_result_<idx>.csv`` line, reference noded.md §6).

    ``loss_rate`` is the fraction 0..1 (avgLossRate); delays are raw driver units, -1 when the ping
    failed; ``timestamp_ms`` is ms since the epoch.
    """

    task_id: int
    src_type: str
    src_addr: str
    dst_type: str
    dst_addr: str
    min_delay: float
    max_delay: float
    avg_delay: float
    loss_rate: float
    timestamp_ms: int

    @property
    def key(self) -> PathKey:
        """The path key (task id, src type, src addr, dst type, dst addr)."""
        return (self.task_id, self.src_type, self.src_addr, self.dst_type, self.dst_addr)


def row_problem(row: PingRow, max_delay: float = MAX_DELAY) -> str | None:
    """Why a row must be skipped (a short reason for counters), or None when it is usable.

    Reasons: ``address`` (empty src/dst), ``loss_range`` (loss outside 0..1 or NaN), ``delay_range``
    (a delay below 0 other than -1, NaN, or above ``max_delay``), ``timestamp`` (not positive).
    """
    if not row.src_addr or not row.dst_addr:
        return "address"
    if not (0.0 <= row.loss_rate <= 1.0):  # also rejects NaN
        return "loss_range"
    for d in (row.min_delay, row.max_delay, row.avg_delay):
        if math.isnan(d) or (d < 0 and d != -1) or d > max_delay:
            return "delay_range"
    if row.timestamp_ms <= 0:
        return "timestamp"
    return None


@dataclass
class PeriodResult:
    """Verdicts of one evaluated period, aligned arrays over the paths that had data in it.

    ``idx`` path indices (``PathWindow.keys[i]``), ``loss`` (%), ``delay`` (raw, NaN = no sample),
    ``loss_thr``/``delay_thr`` (inf = no baseline yet), ``loss_fault``/``delay_fault`` (bool).
    """

    period: int
    idx: np.ndarray
    loss: np.ndarray
    delay: np.ndarray
    loss_thr: np.ndarray
    delay_thr: np.ndarray
    loss_fault: np.ndarray
    delay_fault: np.ndarray

    @property
    def fault(self) -> np.ndarray:
        """Either metric faulty."""
        return self.loss_fault | self.delay_fault


def _baseline(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column-wise (count, mean, population std) ignoring NaN."""
    ok = ~np.isnan(values)
    count = ok.sum(axis=0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.where(ok, values, 0.0).sum(axis=0) / count
        dev = np.where(ok, values - mean, 0.0)
        std = np.sqrt((dev * dev).sum(axis=0) / count)
    return count, mean, std


class PathWindow:
    """The window of one super pod. Not thread-safe: one owner calls :meth:`add` and :meth:`evaluate`.

    Parameters: ``period_ms`` (> 0), ``periods`` (window length, >= baseline_periods + 2),
    ``baseline_periods`` (8), ``min_baseline`` (clean baseline periods needed for a first threshold),
    ``sigma`` (3), ``std_floor`` (1, in the metric's unit), ``delay_rel_floor`` (0 = the reference's
    rule; the analyzer uses 0.15: the delay's std floor is at least this share of its baseline
    mean), ``loss_abs_pct`` (absolute loss bound, None = off), ``delay_abs`` (absolute delay bound,
    None = off). Raises ``ValueError`` on bad values.
    """

    def __init__(
        self,
        period_ms: int,
        *,
        periods: int = 10,
        baseline_periods: int = 8,
        min_baseline: int = 3,
        sigma: float = 3.0,
        std_floor: float = 1.0,
        delay_rel_floor: float = 0.0,
        loss_abs_pct: float | None = 20.0,
        delay_abs: float | None = None,
        max_delay: float = MAX_DELAY,
    ) -> None:
        if period_ms <= 0 or baseline_periods < 1 or periods < baseline_periods + 2 or min_baseline < 1:
            raise ValueError("need period_ms > 0, baseline >= 1, periods >= baseline + 2, min_baseline >= 1")
        self.period_ms = int(period_ms)
        self.periods = periods
        self.baseline_periods = baseline_periods
        self.min_baseline = min(min_baseline, baseline_periods)
        self.sigma = sigma
        self.std_floor = std_floor
        self.delay_rel_floor = delay_rel_floor
        self.loss_abs_pct = loss_abs_pct
        self.delay_abs = delay_abs
        self.max_delay = max_delay
        self.keys: list[PathKey] = []
        self.index: dict[PathKey, int] = {}
        self.newest = -1  # newest period seen
        self._slot_period = np.full(periods, -1, dtype=np.int64)
        self._reasons = list(_REASONS)
        self._gate: Callable[[PathKey], str | None] | None = None
        self._gate_code = np.zeros(0, dtype=np.int8)  # per path: 0 = admitted, else a reason code
        self._gate_new: dict[PathKey, int] = {}  # refused keys that have no path (bounded)
        self._alloc(256)

    def set_gate(self, gate: Callable[[PathKey], str | None] | None) -> None:
        """Admit rows by path: ``gate(key)`` returns None (admitted) or the reason counted for its
        rows, checked before every other reason; asked once per path key until the next
        ``set_gate`` (e.g. after a topology change). None admits every path."""
        self._gate = gate
        self._gate_new.clear()
        codes = np.zeros(self._cap, dtype=np.int8)
        if gate is not None:
            codes[: len(self.keys)] = [self._code(gate(k)) for k in self.keys]
        self._gate_code = codes

    def _code(self, reason: str | None) -> int:
        if reason is None:
            return 0
        if reason not in self._reasons:
            self._reasons.append(reason)
        return self._reasons.index(reason)

    def _alloc(self, cap: int) -> None:
        w = self.periods
        old = getattr(self, "_cap", 0)
        new = {
            "_loss_sum": np.zeros((w, cap)),
            "_loss_cnt": np.zeros((w, cap)),
            "_delay_sum": np.zeros((w, cap)),
            "_delay_cnt": np.zeros((w, cap)),
            "_loss_flag": np.zeros((w, cap), dtype=bool),
            "_delay_flag": np.zeros((w, cap), dtype=bool),
        }
        refs = {
            "_ref_loss": np.full((2, cap), np.nan),
            "_ref_delay": np.full((2, cap), np.nan),
        }
        for name, arr in {**new, **refs}.items():
            if old:
                arr[:, :old] = getattr(self, name)
            setattr(self, name, arr)
        gate = np.zeros(cap, dtype=np.int8)
        gate[:old] = self._gate_code[:old]
        self._gate_code = gate
        self._cap = cap

    def path(self, key: PathKey) -> int:
        """The index of a path key (allocated on first use)."""
        i = self.index.get(key)
        if i is None:
            i = len(self.keys)
            if i >= self._cap:
                self._alloc(self._cap * 2)
            self.index[key] = i
            self.keys.append(key)
        return i

    def _new_code(self, key: PathKey) -> int:
        """Reason code of a key without a path yet: the gate's verdict, then an empty address."""
        code = self._gate_new.get(key)
        if code is not None:
            return code
        code = self._code(self._gate(key)) if self._gate is not None else 0
        if code == 0 and not (key[2] and key[4]):
            code = 1
        if code:
            if len(self._gate_new) >= 100_000:
                self._gate_new.clear()  # a flood of distinct bad keys costs time, never memory
            self._gate_new[key] = code
        return code

    def _slot_for(self, s: int, k: int) -> None:
        """Give slot ``s`` to period ``k`` (cleared when it held another period)."""
        if self._slot_period[s] != k:
            for name in ("_loss_sum", "_loss_cnt", "_delay_sum", "_delay_cnt", "_loss_flag", "_delay_flag"):
                getattr(self, name)[s, :] = 0
            self._slot_period[s] = k

    def add(self, rows: Iterable[PingRow], now_ms: int | None = None) -> dict[str, int]:
        """Merge rows into their periods. Returns counts: ``accepted`` and one per skip reason
        (:func:`row_problem` reasons, checked in its order, then ``future`` = more than 60 s ahead
        of ``now_ms``, ``late`` = older than the window, which ends ``periods`` periods before the
        newest period seen so far, rows in the order given). A row of a period whose slot a newer
        period of the same call takes is accepted and then dropped with the slot.

        Columnar: one pass of numpy over the rows' fields; only paths seen for the first time
        cost a Python step each."""
        rows = rows if isinstance(rows, list) else list(rows)
        counts: dict[str, int] = {"accepted": 0}
        if not rows:
            return counts
        if set(map(len, rows)) != {_ROW_FIELDS}:
            raise ValueError(f"a ping row has {_ROW_FIELDS} fields")
        # one C-level pass per column (zip(*rows) over 47k rows costs 2-3x more, issue 18)
        mn, mx, avg, loss, ts = (list(map(itemgetter(j), rows)) for j in range(5, _ROW_FIELDS))
        # the keys are looked up as they are made (not kept: 47k live tuples cost the GC passes);
        # only the rows of paths seen for the first time make theirs again below
        idx = np.fromiter(map(self.index.get, map(_KEY, rows), repeat(-1)), dtype=np.int64, count=len(rows))
        new = np.flatnonzero(idx < 0)
        why = np.zeros(len(rows), dtype=np.int8)  # 0 = ok, else index into self._reasons
        if self._gate is not None:
            known = np.flatnonzero(idx >= 0)
            why[known] = self._gate_code[idx[known]]
        if len(new):
            why[new] = [self._new_code(_KEY(rows[j])) for j in new.tolist()]
        loss_a = np.array(loss, dtype=float)
        delays = np.array((mn, mx, avg), dtype=float)
        ts_a = np.array(ts, dtype=float)
        with np.errstate(invalid="ignore"):
            bad_loss = ~((loss_a >= 0.0) & (loss_a <= 1.0))
            bad_delay = (np.isnan(delays) | ((delays < 0) & (delays != -1)) | (delays > self.max_delay)).any(
                axis=0
            )
            bad_ts = ~((ts_a > 0) & (ts_a < 2.0**62))
        for code, mask in ((2, bad_loss), (3, bad_delay), (4, bad_ts)):
            why[(why == 0) & mask] = code
        if now_ms is not None:
            why[(why == 0) & (ts_a > now_ms + FUTURE_SLACK_MS)] = 5
        ok = why == 0
        k = np.where(ok, ts_a, 0).astype(np.int64) // self.period_ms
        if ok.any():
            run_max = np.maximum.accumulate(np.where(ok, k, self.newest))
            run_max = np.maximum(run_max, self.newest)
            why[ok & (k <= run_max - self.periods)] = 6
            ok = why == 0
            self.newest = max(self.newest, int(run_max[-1]))
        for code in np.unique(why[why > 0]).tolist():
            counts[self._reasons[code]] = int((why == code).sum())
        acc = np.flatnonzero(ok)
        if not len(acc):
            return counts
        for j in acc[idx[acc] < 0].tolist():  # first sighting of a path (maybe twice in one call)
            idx[j] = self.path(_KEY(rows[j]))
        i = idx[acc]
        kk = k[acc]
        s = kk % self.periods
        # per slot, the newest period of this call wins (an older one's rows go with the slot)
        top = np.full(self.periods, -1, dtype=np.int64)
        np.maximum.at(top, s, kk)
        for slot in np.flatnonzero(top >= 0).tolist():
            self._slot_for(slot, int(top[slot]))
        keep = kk == top[s]
        i, s = i[keep], s[keep]
        flat = s * self._cap + i
        size = self.periods * self._cap
        ls = loss_a[acc][keep] * 100.0
        dl = delays[2][acc][keep]
        has_d = dl >= 0
        self._loss_sum += np.bincount(flat, ls, size).reshape(self.periods, self._cap)
        self._loss_cnt += np.bincount(flat, None, size).reshape(self.periods, self._cap)
        self._delay_sum += np.bincount(flat[has_d], dl[has_d], size).reshape(self.periods, self._cap)
        self._delay_cnt += np.bincount(flat[has_d], None, size).reshape(self.periods, self._cap)
        counts["accepted"] = len(acc)
        return counts

    def _values(self, s: int, which: str) -> np.ndarray:
        n = len(self.keys)
        sm = getattr(self, f"_{which}_sum")[s, :n]
        ct = getattr(self, f"_{which}_cnt")[s, :n]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ct > 0, sm / np.where(ct > 0, ct, 1), np.nan)

    def _threshold(self, k: int, which: str, abs_bound: float | None) -> np.ndarray:
        n = len(self.keys)
        rows = []
        for j in range(k - self.baseline_periods, k):
            s = j % self.periods
            if self._slot_period[s] != j:
                continue
            v = self._values(s, which)
            v[getattr(self, f"_{which}_flag")[s, :n]] = np.nan
            rows.append(v)
        ref = getattr(self, f"_ref_{which}")
        if rows:
            count, mean, std = _baseline(np.vstack(rows))
            fresh = count >= self.min_baseline
            ref[0, :n] = np.where(fresh, mean, ref[0, :n])
            ref[1, :n] = np.where(fresh, std, ref[1, :n])
        mean, std = ref[0, :n], ref[1, :n]
        floor = self.std_floor
        if which == "delay" and self.delay_rel_floor:
            floor = np.maximum(floor, self.delay_rel_floor * np.nan_to_num(mean))
        thr = np.where(np.isnan(mean), np.inf, mean + self.sigma * np.maximum(std, floor))
        if abs_bound is not None:
            thr = np.minimum(thr, abs_bound)
        return thr

    def evaluate(self, k: int) -> PeriodResult:
        """Verdicts for period ``k`` (see the module doc). Periods must be evaluated in order for the
        fault masks to apply; evaluating one period twice gives the same verdicts."""
        n = len(self.keys)
        s = k % self.periods
        empty = np.zeros(0)
        if n == 0 or self._slot_period[s] != k:
            return PeriodResult(k, np.zeros(0, dtype=np.int64), empty, empty, empty, empty,
                                np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))  # fmt: skip
        loss = self._values(s, "loss")
        delay = self._values(s, "delay")
        loss_thr = self._threshold(k, "loss", self.loss_abs_pct)
        delay_thr = self._threshold(k, "delay", self.delay_abs)
        with np.errstate(invalid="ignore"):
            loss_fault = ~np.isnan(loss) & (loss >= loss_thr)
            delay_fault = ~np.isnan(delay) & (delay >= delay_thr)
        self._loss_flag[s, :n] = loss_fault
        self._delay_flag[s, :n] = delay_fault
        idx = np.flatnonzero(~np.isnan(loss))
        return PeriodResult(
            k, idx, loss[idx], delay[idx], loss_thr[idx], delay_thr[idx], loss_fault[idx], delay_fault[idx]
        )
