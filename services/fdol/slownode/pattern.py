"""faultmesh's compute-straggler pattern detector (an addition to reference fdol.md §4).

Why: the reference gates everything on step-time degradation (default 30 %). A rank doing ~40 %
more compute raises every rank's step time by only 5–14 % on an oversubscribed box (measured:
../shared/reference/torch-real-input.md §3–4), so the reference never looks further. The straggler
is still plain in the per-rank *pattern*: its compute is the highest and it waits least in its TP
collective, while its TP partners wait most.

What it does, per TP group (ranks of this node, >= 2), over a window of the last
``patternWindowSteps`` steps (by step number, so stale values age out):

- ``compute ratio`` of rank r = median(compute_r) / median over the other members of their median
  compute. compute = the host ``forward`` time of the step (FP marker), or step time minus
  communication time when no forward markers exist;
- ``wait ratio`` of rank r = median over the other members of their median TP collective duration
  (ZP_device) / median(ZP_device of r);
- *baseline ratio* of rank r = the same compute ratio over each member's first ``normalNumber``
  steps (the job's own baseline, like the time detector's). A rank that was slower from the start
  (a persistent natural asymmetry, e.g. CPU placement on an oversubscribed box) is judged against
  it: the compute ratio must also exceed the baseline ratio by half the margin
  (``compute ratio / baseline ratio > 1 + (computeRatio - 1) / 2``);
- r is *flagged* when compute ratio > ``computeRatio`` (1.10), the baseline condition holds and
  wait ratio > ``waitRatio`` (3); both ratios need at least half a window of samples per member;
- r is a *suspect* when its compute conditions hold but the wait condition does not (or the window
  holds too few TP collective samples because communication profiling is off): the cluster then
  keeps or switches communication profiling on to decide.

Measured on the real 4-rank CPU job (torch-real-input.md §4b): the rule flagged the slow rank in
5/5 30-step windows and 9/10 15-step windows with 0 clean windows flagged; natural stragglers on a
clean box reach compute +7 % / wait ratio 2.6, under both thresholds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .metrics import StepMetrics


def compute_value(m: StepMetrics) -> float:
    """Compute time of a step (ns): forward time, else step time minus communication, else 0."""
    if m.compute > 0:
        return float(m.compute)
    if m.comm_wait > 0 and m.step_time > m.comm_wait:
        return float(m.step_time - m.comm_wait)
    return 0.0


@dataclass
class PatternResult:
    """Flagged ranks, suspect ranks and the ratios per rank (``{rank: (compute ratio, wait ratio|None)}``)."""

    flagged: list[int] = field(default_factory=list)
    suspects: list[int] = field(default_factory=list)
    ratios: dict[int, tuple[float, float | None]] = field(default_factory=dict)


class PatternDetector:
    """See module doc. ``window``: steps; ``compute_ratio``/``wait_ratio``: thresholds (> 1)."""

    def __init__(self, window: int = 20, compute_ratio: float = 1.10, wait_ratio: float = 3.0) -> None:
        self.window = window
        self.compute_ratio = compute_ratio
        self.wait_ratio = wait_ratio
        self.min_samples = max(2, window // 2)

    def evaluate(
        self,
        groups: Iterable[Sequence[int]],
        history: dict[int, Sequence[StepMetrics]],
        baseline: dict[int, float] | None = None,
    ) -> PatternResult:
        """``groups``: TP groups (local ranks); ``history``: recent steps per rank, chronological;
        ``baseline``: per-rank baseline compute (median of the first steps, ns) — a rank whose group
        lacks baselines is never flagged nor suspected (None disables the baseline condition)."""
        res = PatternResult()
        rel = 1 + (self.compute_ratio - 1) / 2
        for group in groups:
            members = [r for r in group if history.get(r)]
            if len(members) < 2:
                continue
            last = max(history[r][-1].step for r in members)
            lo = last - self.window
            comp: dict[int, float] = {}
            wait: dict[int, float] = {}
            for r in members:
                win = [m for m in history[r] if m.step > lo]
                cv = [x for x in (compute_value(m) for m in win) if x > 0]
                wv = [float(m.zp_device) for m in win if m.zp_device > 0]
                if len(cv) >= self.min_samples:
                    comp[r] = statistics.median(cv)
                if len(wv) >= self.min_samples:
                    wait[r] = statistics.median(wv)
            if len(comp) < 2:
                continue
            for r in comp:
                others = [comp[m] for m in comp if m != r]
                base = statistics.median(others)
                if base <= 0:
                    continue
                cr = comp[r] / base
                wr: float | None = None
                if r in wait and len(wait) >= 2:
                    ow = statistics.median([wait[m] for m in wait if m != r])
                    wr = ow / wait[r] if wait[r] > 0 else None
                res.ratios[r] = (round(cr, 4), None if wr is None else round(wr, 4))
                if baseline is not None:
                    b_others = [baseline[m] for m in comp if m != r and baseline.get(m)]
                    if not baseline.get(r) or len(b_others) != len(comp) - 1:
                        continue
                    br = baseline[r] / statistics.median(b_others)
                    if cr / br <= rel:
                        continue
                if cr > self.compute_ratio:
                    if wr is not None and wr > self.wait_ratio:
                        res.flagged.append(r)
                    else:
                        res.suspects.append(r)
        res.flagged.sort()
        res.suspects.sort()
        return res
