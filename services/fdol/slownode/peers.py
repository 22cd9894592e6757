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
from itertools import islice

import numpy as np

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


def _aligned(
    group: Sequence[int], history: dict[int, Sequence[StepMetrics]], window: int, known: dict | None = None
) -> list[tuple[int, dict[int, tuple[int, ...]] | None]]:
    """(step, {rank: tp_ops}) for the members' last ``window + 8`` steps; the vector is None for
    steps in ``known`` (already judged) when every member has the same steps."""
    tails = [list(islice(reversed(history.get(r, ())), window + 8))[::-1] for r in group]
    n = len(group)
    out: list[tuple[int, dict[int, tuple[int, ...]] | None]] = []
    first = [m.step for m in tails[0]]
    if all([m.step for m in t] == first for t in tails[1:]):  # the usual case: same steps everywhere
        for st, ms in zip(first, zip(*tails, strict=True), strict=True):
            if known is not None and st in known:
                out.append((st, None))
                continue
            ops = [op_waits(m) for m in ms]
            if ops[0] and all(len(o) == len(ops[0]) for o in ops):
                out.append((st, dict(zip(group, ops, strict=True))))
        return out
    by_step: dict[int, dict[int, tuple[int, ...]]] = {}
    for r, tail in zip(group, tails, strict=True):
        for m in tail:
            o = op_waits(m)
            if o:
                by_step.setdefault(m.step, {})[r] = o
    for st in sorted(by_step):
        vec = by_step[st]
        if len(vec) == n and len({len(v) for v in vec.values()}) == 1:
            out.append((st, vec))
    return out


def aligned_ops(
    group: Sequence[int], history: dict[int, Sequence[StepMetrics]], window: int
) -> list[dict[int, tuple[int, ...]]]:
    """The last ``window`` steps (chronological) where every member has the same non-zero number
    of per-operation waits: per step {rank: tp_ops}."""
    return [v for _, v in _aligned(group, history, window) if v is not None][-window:]


def collective_times(
    group: Sequence[int], history: dict[int, Sequence[StepMetrics]], n: int, oldest: bool = False
) -> list[float]:
    """Per aligned step (the last ``n``; ``oldest``: the first ``n`` in ``history``): the median over
    the step's operations of the least member wait (ns), the collective's own time."""
    steps = [v for _, v in _aligned(group, history, 10**9) if v is not None]
    steps = steps[:n] if oldest else steps[-n:]
    out = []
    for vec in steps:
        least = sorted(min(col) for col in zip(*vec.values(), strict=True))
        h = len(least) // 2
        out.append(least[h] if len(least) % 2 else (least[h - 1] + least[h]) / 2)
    return out


def step_arrivals(
    steps: Sequence[dict[int, tuple[int, ...]]], asym: float
) -> list[tuple[tuple[int, ...], int]]:
    """Per step: (operations each member — in rank order — arrived last in, counted operations).
    An operation counts when the others' median wait is ``1 + asym`` times the least; ties go to
    the lowest rank. Steps of different groups may be mixed (one vectorized pass)."""
    return _arrivals([[vec[r] for r in sorted(vec)] for vec in steps], asym)


def _arrivals(rows: Sequence[Sequence[tuple[int, ...]]], asym: float) -> list[tuple[tuple[int, ...], int]]:
    out: list[tuple[tuple[int, ...], int]] = [((), 0)] * len(rows)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, row in enumerate(rows):
        by_shape.setdefault((len(row), len(row[0])), []).append(i)
    for (n, _), idx in by_shape.items():
        a = np.asarray([rows[i] for i in idx], dtype=np.float64).transpose(0, 2, 1)  # [step, op, member]
        srt = np.sort(a, axis=2)
        least = srt[:, :, 0]
        h = (n - 1) // 2
        med = srt[:, :, 1 + h] if (n - 1) % 2 else (srt[:, :, h] + srt[:, :, h + 1]) / 2
        ok = (least > 0) & (med >= least * (1 + asym))
        who = np.where(ok, np.argmin(a, axis=2), n)  # n: not counted
        per = (who[:, :, None] == np.arange(n)).sum(axis=1).tolist()
        tot = ok.sum(axis=1).tolist()
        for k, i in enumerate(idx):
            out[i] = (tuple(per[k]), tot[k])
    return out


def last_arrivals(steps: Sequence[dict[int, tuple[int, ...]]], asym: float) -> tuple[dict[int, int], int]:
    """-> ({rank: operations it arrived last in}, counted operations) over ``steps`` (same members)."""
    if not steps:
        return {}, 0
    ranks = sorted(steps[0])
    counts = dict.fromkeys(ranks, 0)
    total = 0
    for per, tot in step_arrivals(steps, asym):
        for r, c in zip(ranks, per, strict=True):
            counts[r] += c
        total += tot
    return counts, total


class PeerDetector:
    """See module doc. ``window``: steps judged per round; ``asym``: least wait below the others'
    median by this factor for an operation to count; ``share``: least share of the counted
    operations; ``z``: margin over the healthy share in binomial standard deviations. Each step is
    judged once (per group, cached while it is in the window)."""

    def __init__(self, window: int = 40, asym: float = 0.2, share: float = 0.25, z: float = 4.0) -> None:
        self.window = window
        self.asym = asym
        self.share = share
        self.z = z
        self._judged: dict[tuple[int, ...], dict[int, tuple[tuple[int, ...], int]]] = {}

    def evaluate(
        self, groups: Iterable[Sequence[int]], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float]]:
        """-> (flagged ranks, {rank: share of the counted operations it arrived last in})."""
        flagged: list[int] = []
        shares: dict[int, float] = {}
        todo = []
        new_rows: list[list[tuple[int, ...]]] = []
        for group in groups:
            key = tuple(sorted(group))
            if len(key) < 2:
                continue
            known = self._judged.get(key, {})
            rows = _aligned(key, history, self.window, known)
            new = [(len(new_rows) + k, st) for k, (st, v) in enumerate(x for x in rows if x[1] is not None)]
            new_rows += [[v[r] for r in key] for _, v in rows if v is not None]
            todo.append((key, known, rows, new))
        results = _arrivals(new_rows, self.asym)  # every group's new steps in one pass
        judged_all = {}
        for key, known, rows, new in todo:
            judged = {st: results[k] for k, st in new}
            for st, v in rows:
                if v is None:
                    judged[st] = known[st]
            judged_all[key] = judged
            window = [judged[st] for st, _ in rows][-self.window :]
            if len(window) < self.window:
                continue
            total = sum(t for _, t in window)
            if total < MIN_OPS:
                continue
            p0 = 1 / len(key)
            need = max(total * self.share, total * p0 + self.z * math.sqrt(total * p0 * (1 - p0)))
            for i, r in enumerate(key):
                c = sum(per[i] for per, _ in window)
                shares[r] = round(c / total, 3)
                if c >= need:
                    flagged.append(r)
        self._judged = judged_all
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
        vals = sorted(m.fwd_min or m.compute for m in islice(reversed(h), window) if m.compute > 0)
        if len(vals) >= window:
            ratios.append(vals[len(vals) // 4] / b)
    return round(min(ratios), 4) if ratios else None


def _iqm(x: np.ndarray) -> np.ndarray:
    """Interquartile mean per column of ``x`` [samples, members] (the middle half of each column)."""
    s = np.sort(x, axis=0)
    k = len(s) // 4
    return s[k : len(s) - k].mean(axis=0)


def _excess(gaps: np.ndarray) -> np.ndarray:
    """[steps, ops, members] gaps (ns, 0 = not measured) -> [valid ops, members]: own log gap minus
    the median of the other members' log gaps of the same operation (ops with a 0 are left out)."""
    ok = (gaps > 0).all(axis=2)
    lg = np.log(gaps[ok].astype(np.float64))  # [valid, n]
    n = lg.shape[1]
    order = np.argsort(lg, axis=1)
    srt = np.take_along_axis(lg, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n)[None, :], axis=1)  # each member's place in srt
    m = n - 1  # the others: srt without the member's place
    lo, hi = (m - 1) // 2, m // 2

    def other(j: int) -> np.ndarray:
        return np.where(pos > j, srt[:, [j]], srt[:, [j + 1]])

    return lg - (other(lo) + other(hi)) / 2


def gap_excess(
    gaps: np.ndarray, short: int, spread: float, floor: float, z: float
) -> tuple[list[int], list[float]]:
    """The gap-excess rule on one TP group (:class:`GapDetector`). ``gaps``: [steps, ops, members]
    ns, chronological (0 = not measured: the operation is left out for every member). -> (flagged
    member positions, score per member: its best window's excess over that window's threshold;
    >= 1 flags)."""
    ok = (gaps > 0).all(axis=2)
    return judge_excess(_excess(gaps), ok.sum(axis=1), short, spread, floor, z)


def judge_excess(
    x: np.ndarray, per_step: np.ndarray, short: int, spread: float, floor: float, z: float
) -> tuple[list[int], list[float]]:
    """``x``: [valid ops, members] excess (:func:`_excess`), chronological; ``per_step``: valid ops
    per step. See :class:`GapDetector`."""
    n = x.shape[1]
    if len(x) < MIN_OPS:
        return [], [0.0] * n
    s = 1.4826 * float(np.median(np.abs(x - np.median(x, axis=0))))
    score = np.zeros(n)
    for w in (short, len(per_step)):
        m = int(per_step[-w:].sum())
        if m < MIN_OPS:
            continue
        thr = max(floor, spread * s, z * s / math.sqrt(m))
        score = np.maximum(score, _iqm(x[-m:]) / thr)
    return [i for i in range(n) if score[i] >= 1], [round(float(v), 3) for v in score]


class GapDetector:
    """faultmesh's slow-card rule from each rank's own compute between its TP collectives
    (``StepMetrics.tp_gaps``): in tensor-parallel training a slow card's layers take longer while
    its TP peers' waits absorb the difference, so the gap between two collectives *is* the card's
    compute of that layer (the wait asymmetry compares waits, which also carry the peers' own
    noise of leaving the previous collective).

    Per TP group of this node (>= 2 local members), over the last ``window`` steps where every
    member has the same number of gaps: per operation, ``d`` = log(own gap) - median of the other
    members' log gaps; ``s`` = the robust spread of ``d`` (1.4826 x MAD, pooled over members, each
    centred on its median). A member is *flagged* when the interquartile mean of its ``d`` over the
    last ``window // 4`` steps or over the whole ``window`` reaches
    ``max(floor, spread * s, z * s / sqrt(ops))``: at least ``floor`` (``computeExcess``, 0.05:
    +5 % compute), at least ``spread`` (``gapSpread``, 1.0) spreads — on a shared-CPU box the
    scheduler keeps one healthy member of a pair behind by as much as its per-operation noise for
    tens of steps (bench/trainsim_tp.py SHARED_BOX, calibrated on the real 4-rank job) —, and
    ``z`` (``waitZ``) standard errors. Calibration on the stand-in shared box (32 healthy runs of
    150 steps, 3 confirming rounds of 5 steps): one run named a member, whose scheduling regime
    made it compute 21 % slower than its peer for 40 steps (any rule that finds a +20 % card
    within 40 steps names it), at ``spread`` 1.0 to 1.3; 4 of 32 at 0.8. On a cluster (per-op noise
    2 %) the floor decides, so +10 % cards are found within the short window.

    Each step's ``d`` is computed once (cached per group while in the window): a round costs the
    new steps and one sort of the window.
    """

    def __init__(self, window: int = 40, spread: float = 1.0, floor: float = 0.05, z: float = 4.0) -> None:
        self.window = window
        self.short = max(2, window // 4)
        self.spread = spread
        self.floor = floor
        self.z = z
        self._rows: dict[tuple[int, ...], dict[int, np.ndarray]] = {}  # group -> step -> d rows

    def evaluate(
        self, groups: Iterable[Sequence[int]], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float], list[tuple[int, ...]]]:
        """-> (flagged ranks, {rank: score}, the groups judged: those with ``window`` steps of gaps;
        the others are left to the wait-asymmetry rule)."""
        flagged: list[int] = []
        scores: dict[int, float] = {}
        judged: list[tuple[int, ...]] = []
        rows_all: dict[tuple[int, ...], dict[int, np.ndarray]] = {}
        for group in groups:
            key = tuple(sorted(group))
            if len(key) < 2:
                continue
            rows = self._update(key, history)
            rows_all[key] = rows
            if len(rows) < self.window:
                continue
            judged.append(key)
            steps = sorted(rows)[-self.window :]
            x = np.concatenate([rows[st] for st in steps])
            per_step = np.array([len(rows[st]) for st in steps])
            hits, sc = judge_excess(x, per_step, self.short, self.spread, self.floor, self.z)
            flagged += [key[i] for i in hits]
            scores.update(zip(key, sc, strict=True))
        self._rows = rows_all
        return sorted(flagged), scores, judged

    def _update(
        self, key: tuple[int, ...], history: dict[int, Sequence[StepMetrics]]
    ) -> dict[int, np.ndarray]:
        """The group's cached rows plus those of the steps every member got since (each member's
        steps are in order, so a step no member can still deliver is final), pruned to the window."""
        rows = dict(self._rows.get(key, {}))
        done = max(rows, default=-1)
        by_step: dict[int, list[tuple[int, ...]]] = {}
        ends = []
        for pos, r in enumerate(key):
            h = history.get(r, ())
            ends.append(h[-1].step if h else -1)
            for m in islice(reversed(h), self.window + 8):
                if m.step <= done:
                    break
                if m.tp_gaps:
                    by_step.setdefault(m.step, [()] * len(key))[pos] = m.tp_gaps
        top = min(ends)
        shapes: dict[int, list[int]] = {}
        for st, row in by_step.items():
            if st <= top and row[0] and all(len(g) == len(row[0]) for g in row):
                shapes.setdefault(len(row[0]), []).append(st)
        for sts in shapes.values():
            sts.sort()
            arr = np.asarray([by_step[st] for st in sts], dtype=np.float64).transpose(0, 2, 1)
            ok = (arr > 0).all(axis=2)
            d = _excess(arr)
            cuts = np.cumsum(ok.sum(axis=1))[:-1]
            for st, part in zip(sts, np.split(d, cuts), strict=True):
                rows[st] = part
        if len(rows) > self.window:
            for st in sorted(rows)[: len(rows) - self.window]:
                del rows[st]
        return rows
