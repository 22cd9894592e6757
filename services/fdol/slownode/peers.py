"""faultmesh's peer-relative slow-card detector: wait asymmetry inside TP groups (an addition to
reference fdol.md §4.5).

Why: in tensor-parallel training the TP collectives sit *inside* the forward range (Megatron), so
every member of a TP group shows the same forward time and the same step time; a slow card shows up
only as *less wait*: it arrives last at each per-operation TP barrier and waits least, its peers wait
``(f - 1) * t_seg`` longer. With per-operation barriers the ratio peers' wait / its wait is about
``1 + (f - 1) * t_seg / t_tp`` (~1.7 at +20 %, ~1.35 at +10 % when compute between barriers is 3.5x
the collective): well under the 3x that :mod:`.pattern` required, but consistent step after step.

Rule, per TP group of this node (>= 2 local members), over the last ``window`` steps where every
member has a TP value (``zp_med``: the median of all the step's TP collectives, robust to the one
collective after a late PP receive or data load; ``zp_device`` when absent):

- per step, member r is *late* when median(peers' TP time) / its TP time >= ``1 + asym``;
- r is *flagged* when it is late in at least ``share`` of the window steps (and at least 2),
  and was late in at most ``base_share`` of its group's first ``normalNumber`` aligned steps (a
  card that was always last is a placement asymmetry, not a fault that appeared).

Step time is never consulted, so stragglers far below the 30 % step-time gate are found; a
cluster-wide slowdown leaves no asymmetry and names nobody.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from .metrics import StepMetrics


def tp_value(m: StepMetrics) -> float:
    """The TP collective time of a step (ns): ``zp_med`` when measured, else ``zp_device``, else 0."""
    return float(m.zp_med or m.zp_device)


def aligned(group: Sequence[int], history: dict[int, Sequence[StepMetrics]]) -> list[dict[int, float]]:
    """Per step (chronological) {rank: TP time} for the steps where every member has a value."""
    by_step: dict[int, dict[int, float]] = {}
    for r in group:
        for m in history.get(r, ()):
            v = tp_value(m)
            if v > 0:
                by_step.setdefault(m.step, {})[r] = v
    n = len(group)
    return [by_step[s] for s in sorted(by_step) if len(by_step[s]) == n]


def late_ranks(vec: dict[int, float], asym: float) -> list[int]:
    """Members of one step's {rank: TP time} that waited ``asym`` less than their peers' median."""
    out = []
    for r, v in vec.items():
        if v <= 0:
            continue
        peers = [x for q, x in vec.items() if q != r]
        if peers and statistics.median(peers) / v >= 1 + asym:
            out.append(r)
    return out


class PeerDetector:
    """See module doc. ``window``: steps judged per round; ``asym``: per-step wait asymmetry
    (0.12 = peers wait 12 % longer); ``share``: fraction of window steps a card must be late;
    ``base_share``: most it may have been late in the baseline; ``normal_number``: baseline steps."""

    def __init__(
        self,
        window: int = 5,
        asym: float = 0.12,
        share: float = 0.4,
        base_share: float = 0.3,
        normal_number: int = 20,
    ) -> None:
        self.window = window
        self.asym = asym
        self.share = share
        self.base_share = base_share
        self.normal_number = normal_number
        self.baseline: dict[tuple[int, ...], dict[int, float]] = {}

    def evaluate(
        self, groups: Iterable[Sequence[int]], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float]]:
        """-> (flagged ranks, {rank: late share in the window}) over the TP groups (local ranks)."""
        flagged: list[int] = []
        shares: dict[int, float] = {}
        for group in groups:
            key = tuple(sorted(group))
            if len(key) < 2:
                continue
            steps = aligned(key, history)
            if key not in self.baseline:
                if len(steps) < self.normal_number + 1:
                    continue
                base = steps[: self.normal_number]
                counts = dict.fromkeys(key, 0)
                for vec in base:
                    for r in late_ranks(vec, self.asym):
                        counts[r] += 1
                self.baseline[key] = {r: c / len(base) for r, c in counts.items()}
            win = steps[-self.window :]
            if not win:
                continue
            counts = dict.fromkeys(key, 0)
            for vec in win:
                for r in late_ranks(vec, self.asym):
                    counts[r] += 1
            need = max(2, self.share * len(win))
            for r, c in counts.items():
                shares[r] = round(c / len(win), 3)
                if c >= need and self.baseline[key].get(r, 0.0) <= self.base_share:
                    flagged.append(r)
        return sorted(flagged), shares


def forward_rise(
    ranks: Sequence[int], history: dict[int, Sequence[StepMetrics]], baseline: dict[int, float], window: int
) -> float | None:
    """Median over the last ``window`` steps of the local ranks' forward time relative to each
    rank's baseline (``baseline[r]``: median forward of its first steps, ns); None without data."""
    ratios = []
    for r in ranks:
        b = baseline.get(r)
        h = history.get(r)
        if not b or not h:
            continue
        vals = [m.compute for m in list(h)[-window:] if m.compute > 0]
        if vals:
            ratios.append(statistics.median(vals) / b)
    return round(statistics.median(ratios), 4) if ratios else None
