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

- per step, member r is *late* when median(peers' TP time) / its TP time >= ``1 + asym`` (0.2: on
  the simulator's jittery cluster, 6 % per-op noise, healthy members stay under 1.19 in 99 % of
  steps; a +10 % card sits at 1.32-1.35);
- r is *flagged* when it is late in at least ``share`` of the n window steps (and at least 2),
  and in more than ``n*b + 3*sqrt(n*b*(1-b))`` of them, ``b`` being the share of its group's first
  ``normalNumber`` aligned steps in which it was late (a card that was often last from the start —
  a placement asymmetry, or a job whose per-step noise dwarfs its TP collective — must be late
  three standard deviations more often than it used to be). The window is the steps since the
  last round, at least ``window`` steps. When more than half of a group's members pass (both of
  a 2-member group, late in turn), the asymmetry is noise and nobody in the group is flagged.

Step time is never consulted, so stragglers far below the 30 % step-time gate are found; a
cluster-wide slowdown leaves no asymmetry and names nobody.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .metrics import StepMetrics


def tp_value(m: StepMetrics) -> float:
    """The TP collective time of a step (ns): ``zp_med`` when measured, else ``zp_device``, else 0."""
    return float(m.zp_med or m.zp_device)


def aligned(
    group: Sequence[int], history: dict[int, Sequence[StepMetrics]], tail: int = 0
) -> list[tuple[int, dict[int, float]]]:
    """Per step (chronological) (step, {rank: TP time}) for the steps where every member has a
    value; ``tail`` > 0 looks only at each member's last ``tail`` steps."""
    by_step: dict[int, dict[int, float]] = {}
    for r in group:
        h = history.get(r, ())
        if tail and len(h) > tail:
            h = list(h)[-tail:]
        for m in h:
            v = tp_value(m)
            if v > 0:
                by_step.setdefault(m.step, {})[r] = v
    n = len(group)
    return [(s, by_step[s]) for s in sorted(by_step) if len(by_step[s]) == n]


def late_ranks(vec: dict[int, float], asym: float) -> list[int]:
    """Members of one step's {rank: TP time} that waited ``asym`` less than their peers' median."""
    out = []
    vals = sorted(vec.values())
    n = len(vals) - 1  # peers per member
    if n < 1:
        return out
    for r, v in vec.items():
        if v <= 0:
            continue
        peers = list(vals)
        peers.remove(v)
        med = peers[n // 2] if n % 2 else (peers[n // 2 - 1] + peers[n // 2]) / 2
        if med / v >= 1 + asym:
            out.append(r)
    return out


class PeerDetector:
    """See module doc. ``window``: steps judged per round; ``asym``: per-step wait asymmetry
    (0.2 = peers wait 20 % longer); ``share``: fraction of window steps a card must be late
    (raised by its baseline share, see module doc); ``normal_number``: baseline steps."""

    def __init__(
        self,
        window: int = 5,
        asym: float = 0.2,
        share: float = 0.4,
        normal_number: int = 20,
    ) -> None:
        self.window = window
        self.asym = asym
        self.share = share
        self.normal_number = normal_number
        self.baseline: dict[tuple[int, ...], dict[int, float]] = {}

    def evaluate(
        self, groups: Iterable[Sequence[int]], history: dict[int, Sequence[StepMetrics]], since: int = -1
    ) -> tuple[list[int], dict[int, float]]:
        """-> (flagged ranks, {rank: late share in the window}) over the TP groups (local ranks).
        The window is the steps after ``since`` (the last round's step), at least ``window``."""
        flagged: list[int] = []
        shares: dict[int, float] = {}
        for group in groups:
            key = tuple(sorted(group))
            if len(key) < 2:
                continue
            known = key in self.baseline
            tail = 0
            if known:
                newest = max((history[r][-1].step for r in key if history.get(r)), default=since)
                tail = max(self.window, newest - since) + 2
            steps = aligned(key, history, tail)
            if not known:
                if len(steps) < self.normal_number + 1:
                    continue
                base = [v for _, v in steps[: self.normal_number]]
                counts = dict.fromkeys(key, 0)
                for vec in base:
                    for r in late_ranks(vec, self.asym):
                        counts[r] += 1
                self.baseline[key] = {r: c / len(base) for r, c in counts.items()}
            win = [v for s, v in steps if s > since]
            if len(win) < self.window:
                win = [v for _, v in steps[-self.window :]]
            if not win:
                continue
            counts = dict.fromkeys(key, 0)
            for vec in win:
                for r in late_ranks(vec, self.asym):
                    counts[r] += 1
            hits = []
            for r, c in counts.items():
                shares[r] = round(c / len(win), 3)
                base = self.baseline[key].get(r, 0.0)
                n = len(win)
                need = max(2, n * self.share, n * base + 3 * math.sqrt(n * base * (1 - base)))
                if c >= need:
                    hits.append(r)
            if len(hits) <= max(1, len(key) // 2):
                flagged.extend(hits)  # more than half of a group "late" in turn is noise
        return sorted(flagged), shares


def forward_rise(
    ranks: Sequence[int], history: dict[int, Sequence[StepMetrics]], baseline: dict[int, float], window: int
) -> float | None:
    """The local ranks' forward time (``fwd_min``, the step's shortest micro-batch forward, else the
    step's forward sum) over the last ``window`` steps relative to each rank's baseline
    (``baseline[r]``: median of the same over its first steps, ns), the *smallest* over the
    ranks (a node computing uniformly slower raises every member's forward; a member that starts
    late — after a slow PP receive or send — shows a shorter forward than its peers); per rank the
    window's lower quartile is used (OS hiccups and checkpoints only ever add time). None without
    data."""
    ratios = []
    for r in ranks:
        b = baseline.get(r)
        h = history.get(r)
        if not b or not h:
            continue
        vals = sorted(m.fwd_min or m.compute for m in list(h)[-window:] if m.compute > 0)
        if len(vals) >= window:
            ratios.append(vals[len(vals) // 4] / b)
    return round(min(ratios), 4) if ratios else None
