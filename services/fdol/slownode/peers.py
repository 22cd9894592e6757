"""faultmesh's peer-relative slow-card detector: wait asymmetry inside TP groups (an addition to
reference fdol.md §4.5).

Why: in tensor-parallel training the TP collectives sit *inside* the forward range (Megatron), so
every member of a TP group shows the same forward time and the same step time; a slow card shows up
only as *less wait*: it arrives last at each per-operation TP barrier and waits least, its peers wait
``(f - 1) * t_seg`` longer. Step time is never consulted, so stragglers far below the 30 % step-time
gate are found; a cluster-wide slowdown leaves no asymmetry and names nobody.

Rule (a sign test), per TP group of this node (>= 2 local members), over the last ``window`` steps
where every member has the same number of per-operation waits (``StepMetrics.tp_ops``: the step's
TP collectives except the first of the step and of each forward, which absorb a late data load or
PP receive and so would blame a slow loader or link on the card; a job with one TP collective per
step, after the forward range, has only that one — then a late data loader also arrives last, and
the node drops the ranks its slow-IO rule names):

- per operation, the member that waited least is the one that arrived last; the operation counts
  when the median of the other members' waits is at least ``1 + asym`` times that least wait (a
  near-tie says nothing);
- over the window's N counted operations, member r is *flagged* when it arrived last in at least
  ``N/n + z * sqrt(N * (1/n) * (1 - 1/n))`` of them (n members; healthy members arrive last in
  about 1/n of the operations) and in at least ``share`` of them, and N >= 2 * ``window``
  (enough evidence).

The operations of one step are not independent (one OS hiccup or one step's noise hits several), so
``z`` (``waitZ``, 4) and the window (``peerWindowSteps``, 40) are set on real data: on the 4-rank
PyTorch job on a 2-core box (4 ranks sharing 2 cores, per-op waits spread 0.4x-2x between healthy
members; the scheduler keeps a pair asymmetric for tens of steps) healthy members reached z 3.6
over 40-step windows (4.4 on a box loaded 4x over its cores) while a +20 % compute rank held 3.1-7.7;
the confirmation over several rounds (:class:`~fdol.slownode.cluster.DegradationTracker`) does
the rest. On a real cluster (per-op noise of a few %) a +10 % card arrives last in nearly every
operation, so the first rounds after onset already pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .metrics import StepMetrics

MIN_OPS = 16  # counted operations below which a window says nothing


def tp_value(m: StepMetrics) -> float:
    """The TP collective time of a step (ns): ``zp_med`` when measured, else ``zp_device``, else 0."""
    return float(m.zp_med or m.zp_device)


def op_waits(m: StepMetrics) -> tuple[int, ...]:
    """The step's per-operation waits: ``tp_ops``, else (a step with one TP collective, outside the
    forward range) that collective's time, else ()."""
    if m.tp_ops:
        return m.tp_ops
    v = int(tp_value(m))
    return (v,) if v > 0 else ()


def aligned_ops(
    group: Sequence[int], history: dict[int, Sequence[StepMetrics]], window: int
) -> list[dict[int, tuple[int, ...]]]:
    """The last ``window`` steps (chronological) where every member has the same non-zero number
    of per-operation waits: per step {rank: tp_ops}."""
    by_step: dict[int, dict[int, tuple[int, ...]]] = {}
    for r in group:
        h = history.get(r, ())
        for m in list(h)[-(window + 8) :]:
            ops = op_waits(m)
            if ops:
                by_step.setdefault(m.step, {})[r] = ops
    n = len(group)
    out = []
    for s in sorted(by_step):
        vec = by_step[s]
        if len(vec) == n and len({len(v) for v in vec.values()}) == 1:
            out.append(vec)
    return out[-window:]


def last_arrivals(steps: Sequence[dict[int, tuple[int, ...]]], asym: float) -> tuple[dict[int, int], int]:
    """-> ({rank: operations it arrived last in}, counted operations) over ``steps``."""
    counts: dict[int, int] = {}
    total = 0
    for vec in steps:
        ranks = sorted(vec)
        for r in ranks:
            counts.setdefault(r, 0)
        k_ops = len(vec[ranks[0]])
        for k in range(k_ops):
            waits = sorted((vec[r][k], r) for r in ranks)
            least, who = waits[0]
            others = [w for w, _ in waits[1:]]
            h = len(others) // 2
            med = others[h] if len(others) % 2 else (others[h - 1] + others[h]) / 2
            if least <= 0 or med < least * (1 + asym):
                continue
            counts[who] += 1
            total += 1
    return counts, total


class PeerDetector:
    """See module doc. ``window``: steps judged per round; ``asym``: least wait below the others'
    median by this factor for an operation to count; ``share``: least share of the counted
    operations; ``z``: margin over the healthy share in binomial standard deviations."""

    def __init__(self, window: int = 40, asym: float = 0.2, share: float = 0.25, z: float = 4.0) -> None:
        self.window = window
        self.asym = asym
        self.share = share
        self.z = z

    def evaluate(
        self, groups: Iterable[Sequence[int]], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float]]:
        """-> (flagged ranks, {rank: share of the counted operations it arrived last in})."""
        flagged: list[int] = []
        shares: dict[int, float] = {}
        for group in groups:
            key = tuple(sorted(group))
            if len(key) < 2:
                continue
            steps = aligned_ops(key, history, self.window)
            if len(steps) < self.window:
                continue
            counts, total = last_arrivals(steps, self.asym)
            if total < MIN_OPS:
                continue
            p0 = 1 / len(key)
            need = max(total * self.share, total * p0 + self.z * math.sqrt(total * p0 * (1 - p0)))
            for r in key:
                c = counts.get(r, 0)
                shares[r] = round(c / total, 3)
                if c >= need:
                    flagged.append(r)
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
