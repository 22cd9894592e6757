"""faultmesh's peer-relative slow-card detectors (an addition to reference fdol.md §4.5): the gap
rule (:class:`GapDetector`, each rank's own compute between its TP collectives against its TP
peers'; used wherever the records carry those gaps) and, below, the wait-asymmetry sign test used
where they do not.

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
the confirmation over several rounds (:class:`~fdol.slownode.degradation.DegradationTracker`) does
the rest. On a real cluster (per-op noise of a few %) a +10 % card arrives last in nearly every
operation, so the first rounds after onset already pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import chain, islice

import numpy as np

from .metrics import StepMetrics
from .ring import Ring as _Ring
from .robust import iqm_iqr, median_spread
from .sequential import MARGIN, SHARED_HOST, StepEvidence
from .shift import ShiftRule

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


def _excess(gaps: np.ndarray) -> np.ndarray:
    """[steps, ops, members] gaps (ns, 0 = not measured) -> [members, valid ops]: own log gap minus
    the median of the other members' log gaps of the same operation (ops with a 0 are left out)."""
    n = gaps.shape[2]
    return excess_rows(gaps.reshape(-1, n).T)


def excess_rows(gaps: np.ndarray) -> np.ndarray:
    """:func:`_excess` of [members, ops] gaps (chronological ops) -> [members, valid ops] float32
    (log-gap differences of a few %: float32 keeps 7 digits and halves the memory each round
    reads)."""
    if gaps.min(initial=1) <= 0:
        gaps = gaps[:, (gaps > 0).all(axis=0)]
    lg = np.log(gaps, dtype=np.float32)
    n = lg.shape[0]
    if n == 2:
        return lg - lg[::-1]
    srt = np.sort(lg, axis=0)
    m = n - 1  # the others: srt without the member's value (above srt[j]: srt[j] stays at j)
    lo, hi = (m - 1) // 2, m // 2
    a = np.where(lg > srt[lo], srt[lo], srt[lo + 1])
    if hi != lo:
        a += np.where(lg > srt[hi], srt[hi], srt[hi + 1])
        a *= 0.5
    return lg - a


def gap_excess(
    gaps: np.ndarray, short: int, spread: float, floor: float, z: float
) -> tuple[list[int], list[float]]:
    """The gap-excess rule on one TP group (:class:`GapDetector`). ``gaps``: [steps, ops, members]
    ns, chronological (0 = not measured: the operation is left out for every member). -> (flagged
    member positions, score per member: its best window's excess over that window's threshold;
    >= 1 flags)."""
    ok = (gaps > 0).all(axis=2)
    return judge_excess(_excess(gaps), ok.sum(axis=1).tolist(), short, spread, floor, z)


def judge_excess(
    x: np.ndarray,
    per_step: Sequence[int],
    short: int,
    spread: float,
    floor: float,
    z: float,
    long_means: np.ndarray | None = None,
    long_spread: float = 0.0,
    pre: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[list[int], list[float]]:
    """``x``: [members, valid ops] excess (:func:`_excess`) of the window, chronological;
    ``per_step``: valid ops per step of it; ``long_means``: [members, steps] each step's mean excess
    over the long horizon (None: not judged); ``pre``: :func:`iqm_iqr` of ``x`` when the caller
    has it. See :class:`GapDetector`."""
    n, total = x.shape
    if total < MIN_OPS:
        return [], [0.0] * n
    mid, iqr = pre if pre is not None else iqm_iqr(x)
    s = median_spread(iqr)
    out = (mid / max(floor, spread * s, z * s / math.sqrt(total))).tolist()
    m = int(sum(islice(reversed(per_step), short)))
    if MIN_OPS <= m < total:
        thr = max(floor, spread * s, z * s / math.sqrt(m))
        out = [max(a, b) for a, b in zip(out, (iqm_iqr(x[:, -m:])[0] / thr).tolist(), strict=True)]
    if long_means is not None and long_spread > 0:
        long_iqm = iqm_iqr(long_means)[0]
        thr = max(floor, long_spread * s)
        out = [max(a, b) for a, b in zip(out, (long_iqm / thr).tolist(), strict=True)]
    return [i for i in range(n) if out[i] >= 1], [round(v, 3) for v in out]


class GapDetector:
    """faultmesh's slow-card rule from each rank's own compute between its TP collectives
    (``StepMetrics.tp_gaps``): in tensor-parallel training a slow card's layers take longer while
    its TP peers' waits absorb the difference, so the gap between two collectives *is* the card's
    compute of that layer (the wait asymmetry compares waits, which also carry the peers' own
    noise of leaving the previous collective).

    Per TP group of this node (>= 2 local members), over the last ``window`` steps where every
    member has the same number of gaps: per operation, ``d`` = log(own gap) - median of the other
    members' log gaps; ``s`` = the robust spread of ``d`` (the median over members of the
    interquartile range of their ``d`` over the window, / 1.349). A member is *flagged* when the interquartile mean of its ``d`` over the
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

    The long horizon (``gapLongWindowSteps``, 160; 0: off): the interquartile mean over the last
    ``long_window`` steps of each step's mean ``d`` reaches ``max(floor, long_spread * s)``
    (``gapLongSpread``, 0.25). A scheduler regime that keeps a healthy member behind lasts tens of
    steps, a slow card every step: on the real PyTorch job on the 2-core box (+20 % compute on one
    rank, 2 and 4 ranks, 400 steps, box load 3-9) healthy members' 160-step excess stayed within
    0.019-0.035 (0.13-0.18 over 40 steps: as much as the 40-step threshold) while the slow rank's
    never fell below 0.079 (2 ranks, s 0.16) / 0.108 (4 ranks, s 0.28); over 40 steps its excess
    was 0.13-0.15, under the one-spread threshold. It names such a card about ``long_window`` steps
    after onset; the windows above stay the fast path.

    Each step's ``d`` is computed once (kept per group, float32, in a ring while in the horizon):
    a round costs the new steps and one sort of the window (and one of the short window, and one
    of the long horizon's per-step means).

    ``seq`` (:mod:`.sequential`, ``seqBound``): from the short window on, each new step's mean
    ``d`` over ``MARGIN`` x ``max(floor, spread * s)`` is a step over; a group whose ``s`` exceeds
    ``SHARED_HOST`` x ``floor`` (ranks sharing CPU cores: bursts of slow steps on healthy members)
    feeds no step over. Ranks passing the bound are flagged.

    ``shift`` (:mod:`.shift`, ``computeShift``, 0.03; 0: off): a member whose per-step excess
    rose by that much over its own earlier level (and now sits ``floor / 2`` above its peers) is
    flagged too: a +5 % card, which the floor cannot tell from the fleet's innate spread.
    """

    def __init__(
        self,
        window: int = 40,
        spread: float = 1.0,
        floor: float = 0.05,
        z: float = 4.0,
        long_window: int = 160,
        long_spread: float = 0.5,
        seq: StepEvidence | None = None,
        shift: float = 0.03,
    ) -> None:
        self.seq = seq if seq is not None else StepEvidence(0)
        self._fresh: tuple[list[int], np.ndarray] | None = None  # the new steps' [members, steps] means
        self.window = window
        self.short = max(2, window // 4)
        self.spread = spread
        self.floor = floor
        self.z = z
        self.long_window = long_window if long_spread > 0 and long_window > window else 0
        self.long_spread = long_spread
        self.shift = ShiftRule(shift, floor, z, self.short)
        self.horizon = max(self.long_window, 4 * window if shift > 0 else 0)  # per-step means kept
        # group -> (last step judged, valid ops per judged step, the [members, ops] excess of those
        # steps, the [members, steps] per-step mean excess of the long horizon, its step count)
        self._state: dict[tuple[int, ...], tuple[int, tuple[int, ...], _Ring, _Ring, int]] = {}

    def evaluate(
        self, groups: Iterable[Sequence[int]], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float], list[tuple[int, ...]]]:
        """-> (flagged ranks, {rank: score}, the groups judged: those whose records carry gaps (the
        others are left to the wait-asymmetry rule); a group is flagged only once it has ``window``
        steps of gaps, as the wait-asymmetry rule needs its whole window too)."""
        flagged: list[int] = []
        scores: dict[int, float] = {}
        judged: list[tuple[int, ...]] = []
        state: dict[tuple[int, ...], tuple[int, tuple[int, ...], _Ring, _Ring, int]] = {}
        for group in groups:
            key = tuple(sorted(group))
            if len(key) < 2:
                continue
            self._fresh = None
            st = state[key] = self._update(key, history)
            if not st[1]:
                continue
            judged.append(key)  # gaps recorded: this rule decides (nobody until its window is full)
            x = st[2].view()
            enough = len(st[1]) >= self.short and x.shape[1] >= MIN_OPS  # the short window's steps
            pre = iqm_iqr(x) if enough else None  # one sort of the window, shared with judge_excess
            s = median_spread(pre[1]) if pre is not None else 0.0
            if self._fresh is not None and self.seq.bound > 0 and pre is not None:
                over = self._fresh[1] >= MARGIN * max(self.floor, self.spread * s)  # the windows', less z
                if s > SHARED_HOST * self.floor:  # ranks sharing CPU cores: a step is no evidence
                    over[:] = False  # (:mod:`.sequential`); the statistics fall back to 0
                flagged += self.seq.feed_group(key, self._fresh[0], over)
            if len(st[1]) < self.window:
                continue
            full = self.long_window and st[4] >= self.long_window  # the long horizon is full
            hits, sc = judge_excess(
                st[2].view(), st[1], self.short, self.spread, self.floor, self.z,
                st[3].view()[:, -self.long_window :] if full else None, self.long_spread, pre,
            )  # fmt: skip
            if s <= SHARED_HOST * self.floor:  # ranks sharing CPU cores: a shift is no evidence
                moved, sh = self.shift.judge(key, st[3].view())
                hits, sc = sorted({*hits, *moved}), [max(a, b) for a, b in zip(sc, sh, strict=True)]
            else:
                self.shift.drop(key)
            flagged += [key[i] for i in hits]
            scores.update(zip(key, sc, strict=True))
        self.shift.keep_only(set(judged))
        self._state = state
        return sorted(set(flagged)), scores, judged

    def _update(
        self, key: tuple[int, ...], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[int, tuple[int, ...], _Ring, _Ring, int]:
        """The group's judged steps plus those every member got since (each member's steps come in
        order, so a step below every member's last is final), the last ``window`` kept (and the
        per-step means of the last ``long_window``)."""
        done, counts, ring, means, n_means = self._state.get(key) or (
            -1, (), _Ring(len(key)), _Ring(len(key)), 0
        )  # fmt: skip
        news = []
        lim = self.window + 8
        for r in key:
            new = []
            for m in islice(reversed(history.get(r, ())), lim):
                if m.step <= done:
                    break
                new.append(m)
            if not new:
                return done, counts, ring, means, n_means  # a member without new steps: nothing is final
            new.reverse()
            news.append(new)
        top = min(new[-1].step for new in news)
        if any(new[-1].step != top for new in news):
            news = [[m for m in new if m.step <= top] for new in news]
        steps = [m.step for m in news[0]]
        cols: list[np.ndarray] = []
        added: list[int] = []  # valid ops per new step (step numbers: nums)
        nums: list[int] = []
        if all([m.step for m in new] == steps for new in news[1:]):
            shape = {len(m.tp_gaps) for new in news for m in new}
            if shape == {0}:
                return top, counts, ring, means, n_means  # no gaps (one TP collective per step, or none)
            if len(shape) == 1:  # the usual case: one conversion, one pass
                o = shape.pop()
                flat = chain.from_iterable(m.tp_gaps for new in news for m in new)
                arr = np.fromiter(flat, np.float32, len(key) * len(steps) * o).reshape(len(key), -1)
                cols.append(excess_rows(arr))
                if arr.min() > 0:
                    added = [o] * len(steps)
                else:  # ops with an unmeasured gap are left out: count the rest per step
                    added = (arr > 0).all(axis=0).reshape(len(steps), o).sum(axis=1).tolist()
                nums, steps = steps, []
        by_step = [{m.step: m for m in new} for new in news] if steps else []
        for st in steps:  # members with different steps or gap counts: step by step
            row = [b.get(st) for b in by_step]
            lens = {len(m.tp_gaps) if m is not None else 0 for m in row}
            if len(lens) == 1 and 0 not in lens:
                d = excess_rows(np.asarray([m.tp_gaps for m in row if m is not None], dtype=np.float32))
                cols.append(d)
                added.append(d.shape[1])
                nums.append(st)
        if added:
            counts = (counts + tuple(added))[-self.window :]
            ring.push(cols, sum(counts))
            if all(added) and (self.horizon or self.seq.bound > 0):
                new_ops = cols[0] if len(cols) == 1 else np.concatenate(cols, axis=1)
                if len(set(added)) == 1:  # the usual case: the same ops in every step
                    step_means = new_ops.reshape(len(key), len(added), added[0]).mean(axis=2)
                else:
                    starts = np.cumsum((0, *added[:-1]))
                    step_means = np.add.reduceat(new_ops, starts, axis=1) / np.asarray(added, np.float32)
                self._fresh = (nums, step_means)  # the sequential test's per-step evidence
                if self.horizon:
                    means.push([step_means], self.horizon)
                    n_means = min(self.horizon, n_means + len(added))
            elif self.horizon:  # a step without a valid op: the horizon starts again
                means, n_means = _Ring(len(key)), 0
                self.shift.drop(key)
        return top, counts, ring, means, n_means
