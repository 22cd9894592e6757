"""Time-dimension detector and homogenization (space detector) — reference fdol.md §4.3 and §4.5.

:class:`TimeDetector` judges one (rank, column) series against the series' own baseline: the first
``normalNumber`` valid values, sorted, ``k`` trimmed from each end (``k = nConsec`` when
``normalNumber >= 4*nConsec``, else 3), mean and population std of the rest. Upper bound:
``mean*(1+degradationPercentage)``, or ``mean + nSigma*std`` when the percentage is 0 (nSigma 0 -> 3).
A value above the bound is abnormal; a normal value is folded into the running mean/std. The series
is slow when its last ``nConsec`` values are all abnormal; degradation = mean(last nConsec)/mean - 1.

:func:`homogenize` finds the slow compute card of a TP group: per step, a recursive 1-D split of
the ranks' TP collective durations flags the *lower* part (the slow card waits least because its
peers wait for it); the flagged set must be the same in each of the last ``nConsec`` steps.

Fixes of reference quirks (named on purpose):
- *exact running statistics*: normal values are folded with Welford's algorithm (the reference's
  variance update is not exact), each value exactly once (the reference folds only the first call
  per round and folds the baseline samples a second time).
- *chronological history*: the last ``nConsec`` values are kept in arrival order (the reference
  pads short increments with earlier values walking backwards).
- *baseline not rescanned*: baseline samples are not judged against their own baseline.
- *small normalNumber*: the trim is clamped so at least one sample remains (the reference panics).
- *nSigma honoured*: used when degradationPercentage is 0.
- *bounded drift* (``fold_cap`` > 0, faultmesh rules): a normal value moves the mean by at most
  ``1/fold_cap`` of its difference, so a slow ramp (thermal throttling over minutes) is not
  followed by the running mean.
- *majority window* (``window`` > 0, faultmesh rules): the series is slow when more than half of
  its last ``window`` values are abnormal, and the degradation is the window's median over the
  mean: ``nConsec`` raw values in a row are crossed by OS hiccups on a loaded host (measured on
  the 4-rank PyTorch job sharing 2 cores: a healthy data loader or TP wait exceeds +30 % three
  steps in a row every few dozen steps).
- *recursive split mapped back to rank ids*: deeper splits return positions in the original list
  (the reference returned positions in the sub-list).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

MAX_FLOAT64 = 1.7976931348623157e308


def valid(x: float) -> bool:
    """A usable sample: > 0 and finite (0, +/-Inf, NaN and MaxFloat64 are excluded, §4.2)."""
    return x > 0 and math.isfinite(x) and x != MAX_FLOAT64


def trim_count(normal_number: int, n_consec: int) -> int:
    """Samples trimmed from each end of the sorted baseline (§4.3), clamped to keep >= 1 sample."""
    k = n_consec if normal_number >= 4 * n_consec else 3
    return max(0, min(k, (normal_number - 1) // 2))


class TimeDetector:
    """One (rank, column) series; see module doc. ``add(x)`` returns True when ``x`` is abnormal."""

    __slots__ = (
        "normal_number",
        "n_sigma",
        "pct",
        "n_consec",
        "fold_cap",
        "window",
        "_buf",
        "n",
        "mean",
        "_m2",
        "history",
        "_vals",
        "_abn",
        "_recent",
    )

    def __init__(
        self,
        normal_number: int,
        n_sigma: float,
        degradation_percentage: float,
        n_consec: int,
        fold_cap: int = 0,
        window: int = 0,
    ) -> None:
        self.fold_cap = fold_cap
        self.window = window
        self.normal_number = normal_number
        self.n_sigma = n_sigma if n_sigma > 0 else 3.0
        self.pct = degradation_percentage
        self.n_consec = n_consec
        self._buf: list[float] | None = []
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.history: deque[tuple[float, bool]] = deque(maxlen=max(n_consec, window))
        self._vals: deque[float] = deque(maxlen=max(n_consec, window))  # the values of ``history``
        self._abn = 0  # abnormal values in ``history``
        self._recent: float | None = None  # cached median of ``history``

    @property
    def ready(self) -> bool:
        """True once the baseline is formed."""
        return self._buf is None

    @property
    def std(self) -> float:
        """Population standard deviation of the baseline plus folded normal values."""
        return math.sqrt(self._m2 / self.n) if self.n else 0.0

    def upper(self) -> float:
        """The abnormal threshold (same unit as the series)."""
        if self.pct > 0:
            return self.mean * (1 + self.pct)
        return self.mean + self.n_sigma * self.std

    def add(self, x: float) -> bool:
        """Feed one value (invalid ones are ignored). Returns True when it is judged abnormal."""
        if not valid(x):
            return False
        if self._buf is not None:
            self._buf.append(x)
            if len(self._buf) >= self.normal_number:
                s = sorted(self._buf)
                k = trim_count(self.normal_number, self.n_consec)
                kept = s[k : len(s) - k] if k else s
                self.n = len(kept)
                self.mean = sum(kept) / self.n
                self._m2 = sum((v - self.mean) ** 2 for v in kept)
                self._buf = None
            return False
        abnormal = x > self.upper()
        h = self.history
        if len(h) == h.maxlen and h[0][1]:
            self._abn -= 1
        h.append((x, abnormal))
        self._vals.append(x)
        self._abn += abnormal
        self._recent = None
        if not abnormal:
            self.n += 1
            d = x - self.mean
            self.mean += d / max(self.n, self.fold_cap)
            self._m2 += d * (x - self.mean)
        return abnormal

    @property
    def slow(self) -> bool:
        """The last ``nConsec`` values are all abnormal (with ``window``: more than half of the
        last ``window``)."""
        if self.window:
            return len(self.history) >= self.window and 2 * self._abn > self.window
        return len(self.history) == self.n_consec and self._abn == self.n_consec

    def recent(self) -> float:
        """Median of the judged values kept (the last ``window``, else ``nConsec``); 0 when none."""
        if self._recent is None:
            vals = sorted(self._vals)
            if not vals:
                return 0.0
            h = len(vals) // 2
            self._recent = vals[h] if len(vals) % 2 else (vals[h - 1] + vals[h]) / 2
        return self._recent

    @property
    def degradation(self) -> float:
        """mean(last nConsec values)/baseline mean - 1 (with ``window``: the window's median);
        0 when not slow; NaN-safe."""
        if not self.slow or self.mean <= 0:
            return 0.0
        v = self.recent() if self.window else sum(self._vals) / len(self._vals)
        d = v / self.mean - 1
        return d if math.isfinite(d) else 0.0


def low_split(values: Sequence[float], cluster_mean_distance: float) -> list[int] | None:
    """One 1-D split (§4.5): indices (into ``values``) of the lower part, or None when no split.

    Sort ascending; the first largest gap splits when it is >= half the range and
    mean(upper)/mean(lower) > ``cluster_mean_distance`` (lower mean must not be 0).
    """
    if len(values) < 2:
        return None
    order = sorted(range(len(values)), key=lambda i: values[i])
    s = [values[i] for i in order]
    gaps = [s[i + 1] - s[i] for i in range(len(s) - 1)]
    g = max(gaps)
    if g <= 0 or g < sum(gaps) / 2:
        return None
    cut = gaps.index(g) + 1
    lower, upper = s[:cut], s[cut:]
    lm = sum(lower) / len(lower)
    if lm == 0:
        return None
    if (sum(upper) / len(upper)) / lm <= cluster_mean_distance:
        return None
    return sorted(order[:cut])


def recursive_low_split(values: Sequence[float], cluster_mean_distance: float) -> list[int]:
    """Repeat :func:`low_split` on the flagged values until no split; positions in ``values``."""
    flagged = list(range(len(values)))
    split = False
    while True:
        sub = low_split([values[i] for i in flagged], cluster_mean_distance)
        if sub is None:
            break
        flagged = [flagged[j] for j in sub]
        split = True
    return flagged if split else []


def homogenize(steps: Sequence[dict[int, float]], n_consec: int, cluster_mean_distance: float) -> list[int]:
    """Slow compute cards of one TP group: ``steps`` are per-step {rank: TP collective duration},
    chronological, only steps where every rank of the group has a value. Uses the last ``n_consec``
    steps; returns the rank ids flagged identically in each of them (else [])."""
    if len(steps) < n_consec or n_consec < 1:
        return []
    common: set[int] | None = None
    for vec in steps[-n_consec:]:
        ranks = sorted(vec)
        flagged = {ranks[i] for i in recursive_low_split([vec[r] for r in ranks], cluster_mean_distance)}
        if not flagged or (common is not None and flagged != common):
            return []
        common = flagged
    return sorted(common or ())
