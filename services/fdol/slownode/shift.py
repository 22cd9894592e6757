"""The level-shift rule of the TP gap excess (issue 34: a +5 % card), beside the level rule of
:class:`.peers.GapDetector`.

Why: the gap rule's level test names a member whose compute between its TP collectives exceeds its
TP peers' by ``computeExcess`` (0.05). That floor is the fleet's own spread: cards of one model
differ in sustained speed by a few percent (Sinha et al. SC'22; bench/trainsim_tp.py models 1 %
standard deviation, cut at 2.5 %), so a healthy card can sit 0.04-0.05 above its peers' median
(a fast group of four around it; bench/trainsim_tp.py, 8 ranks, seed 4: 0.047 over 40 steps)
and a card that slows by 5 % (log excess 0.049) lands anywhere from 0.025 to 0.07: on either side
of any level floor. What separates it is that it *changed*: a healthy card keeps its innate
excess from step to step, a card that slows moves from its own earlier level to a higher one.

Rule, per TP group (>= 2 members), from the per-step means of the log gap excess ``d`` (each
step's mean over its operations; the long horizon's, ``gapLongWindowSteps``): ``cur`` = the
interquartile mean of a member's last ``short`` steps (``peerWindowSteps // 4``), ``base`` = that
of the steps before them in the horizon (>= ``short`` of them), ``ss`` = the median over members
of the interquartile range / 1.349 of their per-step means before the short window. A member is
*flagged* when

- ``cur - base >= max(computeShift, z * 1.093 * ss * sqrt(1/short + 1/steps in base))``
  (``computeShift``, 0.03: above the healthy change, under the +5 % card's 0.049; ``z``:
  ``waitZ``; 1.093: an interquartile mean's standard error over the mean's), and
- the rise is its own: it exceeds ``OWN`` (1.5) x the largest fall of another member's excess
  (the excess is relative: when a peer recovers from a slowdown the others' excess rises, by half
  its fall in a group of three; when a card slows its peers' excess falls, by half its rise in a
  group of three, by less in larger ones),
  or, where that cannot tell (a group of two: one member's rise is the other's fall),
  ``cur >= computeExcess / 2``: it now sits above its peers by half the fleet's spread; a
  member whose partner recovered sits where it innately does.

While a member is flagged its ``base`` is held (the level before the shift), so a card that stays
slow stays flagged however long the confirmation takes (``nConsecSlowRoundsToConfirm`` rounds of
any number of steps); it is released when the member falls back under the threshold.

Measured (bench/trainsim_tp.py, every round from step 29): a healthy member's shift reached 0.009
(per-op noise 2 %; 8-256 ranks, 4 seeds) and 0.030 (jittery: 6 %, hiccups; 64-1024 ranks, 6
seeds: 4.1 standard errors, the ``z`` term's 0.030 there); a +5 % card's shift 10 steps after
onset was 0.045-0.049 with its level 0.035 or more. bench/slownode_realistic.py: a +5 % card
confirmed in 8 of 8 jobs (seeds 0-1), 12 of 12 (seeds 7-9) and 8 of 8 with every noise x1.5, 3
rounds after onset (the level rule alone: 4, 7 and 4); every other kind and the shared-box
stand-ins as without it. Cost: about 20 us per TP group and round (8 members, a 160-step horizon).

Not judged where the group's per-op spread ``s`` exceeds ``SHARED_HOST`` x ``computeExcess`` (ranks
sharing CPU cores: scheduler regimes move a healthy member by its per-op noise for tens of steps,
:mod:`.sequential`): a shift there is no evidence of the card.
"""

from __future__ import annotations

import math

import numpy as np

from .robust import iqm_iqr, median_spread

OWN = 1.5  # a member's rise is its own when it exceeds this x any other member's fall (module doc)
IQM_SE = 1.093  # an interquartile mean's standard error / the mean's, normal samples (efficiency 0.837)


class ShiftRule:
    """The level-shift rule (module doc). ``shift``: ``computeShift`` (<= 0: off); ``floor``:
    ``computeExcess``; ``z``: ``waitZ``; ``short``: steps of the current level. Keeps, per group,
    the held base of its flagged members."""

    def __init__(self, shift: float, floor: float, z: float, short: int) -> None:
        self.shift = shift
        self.floor = floor
        self.z = z
        self.short = short
        self._held: dict[tuple[int, ...], list[float | None]] = {}  # group -> held base per member

    def judge(self, key: tuple[int, ...], means: np.ndarray) -> tuple[list[int], list[float]]:
        """``means``: [members of ``key``, steps] per-step mean excess, chronological. -> (flagged
        member positions, score per member: shift over threshold, >= 1 with the level flags)."""
        n, k = means.shape
        if self.shift <= 0 or k < 2 * self.short:
            self._held.pop(key, None)
            return [], [0.0] * n
        cur = iqm_iqr(means[:, -self.short :])[0].tolist()  # a few members: lists from here on
        before, old_iqr = iqm_iqr(means[:, : -self.short])
        held = self._held.get(key, [None] * n)
        base = [b if h is None else h for b, h in zip(before.tolist(), held, strict=True)]
        ss = median_spread(old_iqr)
        thr = max(self.shift, self.z * IQM_SE * ss * math.sqrt(1 / self.short + 1 / (k - self.short)))
        rise = [c - b for c, b in zip(cur, base, strict=True)]
        low = sorted(rise)[:2]  # another member's lowest rise: the 2nd lowest for the lowest
        over = [
            r >= thr and (r > -OWN * (low[1] if r == low[0] else low[0]) or c >= self.floor / 2)
            for r, c in zip(rise, cur, strict=True)  # its own rise (more than any other fell), or above
        ]
        self._held[key] = [b if o else None for b, o in zip(base, over, strict=True)]
        return [i for i in range(n) if over[i]], [round(r / thr, 3) for r in rise]

    def drop(self, key: tuple[int, ...]) -> None:
        """Forget the group's held bases (its horizon started again, or it is not judged)."""
        self._held.pop(key, None)

    def keep_only(self, keys: set[tuple[int, ...]]) -> None:
        """Forget the groups not in ``keys`` (no longer detection groups)."""
        for key in set(self._held) - keys:
            del self._held[key]
