"""Sequential confirmation of slow cards across steps (issue 34).

The round rules (:mod:`.dp`, :class:`.peers.GapDetector`) judge a window of steps each
``nSecondsDoOneDetection`` and the confirmation waits ``nConsecSlowRoundsToConfirm`` slow rounds:
a +20 % card is named 3-5 rounds (90-150 s at the reference's 30 s rounds) after it slowed,
whatever the strength of the evidence. Here each step is one observation and the confirmation comes
as soon as the evidence passes a bound (Page's CUSUM of a sequential probability ratio test, Wald
1945 / Page 1954): a strong straggler is confirmed within a few steps, a weak one later, a healthy
card -- whose steps only now and then cross the threshold -- never.

Per rank and step the observation is *over*: the step's relative excess over its peers -- the
median of its per-op arrival lags / expert compute excess (:mod:`.dp`), the mean of its per-op TP
compute-gap excess (:class:`.peers.GapDetector`, the long horizon's per-step means) -- reaches ``MARGIN`` (1.5) x the
rule's threshold of the round (``dpLagExcess`` / ``computeExcess`` and the peers' own spread). The
margin keeps a card that is innately just under the threshold (cards of one model differ by a few
percent: bench/slownode_dp.py ``--card-sd 0.02``) from being over in most of its steps; a card
nearer the threshold is left to the rounds' windows, which average over more steps. The statistic

    S_t = max(0, S_{t-1} + (ln(P_SLOW / P_HEALTHY) if over else ln((1 - P_SLOW) / (1 - P_HEALTHY))))

is the log-likelihood ratio of "over in ``P_SLOW`` of the steps" (a slow card: every step, noise
aside) against "over in ``P_HEALTHY``" (a healthy card near its peers' spread, or a mixture-of-
experts rank that token routing made hot in a step), restarted at 0 whenever it turns negative (and held at or below twice the bound, so that a card that
recovers falls under it within about as many steps as it took to pass); a
rank *passes* once ``S >= seqBound`` (FeatConf, default 6.0: about six steps over the threshold
with none under; ``0``: off, only the rounds confirm). The bound is the test's false-alarm control:
a card over the threshold in 30 % of its steps crosses 6.0 about once in e^6 = 400 runs of
independent steps; the default was chosen on bench/slownode_dp.py and bench/slownode_realistic.py
(0 false alarms on every kind, including MoE skew and heavy jitter).

Steps are fed once each (by step number, per rank), from the rule's short window on (a quarter of
``peerWindowSteps``: the threshold's spread is not judged on a handful of steps); a restart of the
job (steps from 1 again) makes the node detector build a fresh one
(:class:`fdol.slownode.node.NodeDetector`).

The bound's false-alarm control holds for steps whose excess is independent from one step to the
next: the measurement noise of a cluster's collectives (the TP gap rule's per-op spread ``s`` of
the log gap excess: 0.024 on bench/trainsim_tp.py's healthy jobs, 0.07 on its jittery ones, 0.09-0.10
with their noise x1.5). It does not hold where the ranks share CPU cores with each other and with
other work: there a healthy rank's compute between its TP collectives runs slower than its peer's
for several steps at a time, whenever a busy neighbour shares its core. The real 4-rank PyTorch job
on a 2-core box (``s`` 0.20-0.58; its stand-in SHARED_BOX 0.13-0.26) had healthy ranks over the
threshold up to 6 steps in a row (statistic 4.9 of the bound 6.0 for 2 ranks, 3.9 for 2 more, in 7
clean runs), and one run beside a second test suite confirmed a healthy rank
(tests/e2e/test_slownode_torch.py's stall test named rank 1: not the stalled rank 2's TP peer, its
waits for rank 2 at the global all-reduce are in no TP gap). So a TP group whose ``s`` exceeds
``SHARED_HOST`` x ``computeExcess`` (0.125 at the default 0.05) gives no per-step evidence (its
statistics fall back to 0): its cards are confirmed by the rounds' windows and long horizon,
calibrated on such boxes (:class:`.peers.GapDetector`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

P_HEALTHY = 0.3  # share of steps over the threshold the test tolerates for a healthy card
P_SLOW = 0.8  # share a slow card is taken to have (it is ~1 for a +10 % card on a cluster)
OVER = math.log(P_SLOW / P_HEALTHY)  # +0.98 per step over the threshold
UNDER = math.log((1 - P_SLOW) / (1 - P_HEALTHY))  # -1.25 per step under it
MARGIN = 1.5  # a step is over when its excess reaches MARGIN x the rule's threshold
CAP = 2.0  # S is held at or below CAP x the bound: a card that recovers drops under it within steps
SHARED_HOST = 2.5  # per-op spread over this x the rule's floor: ranks sharing CPU cores (module doc)


class StepEvidence:
    """Per-rank sequential statistic over steps (module doc), kept per detection group. ``bound``:
    ``seqBound`` (<= 0: off: nothing is fed and nobody passes)."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self.stat: dict[int, float] = {}  # rank -> S
        self._groups: dict[tuple[int, ...], tuple[int, np.ndarray]] = {}  # -> (last step fed, S)

    def feed_group(self, key: tuple[int, ...], steps: Sequence[int], over: np.ndarray) -> list[int]:
        """Feed a group's steps: ``steps`` (chronological step numbers) and ``over`` ([members of
        ``key``, steps] bool: the step was over the threshold); steps at or below the last one fed
        to this group are skipped. -> the members at or over the bound."""
        if self.bound <= 0:
            return []
        last, s = self._groups.get(key) or (-1, np.zeros(len(key)))
        new = [i for i, st in enumerate(steps) if st > last]
        if new:
            inc = np.where(over[:, new], OVER, UNDER)
            cap = CAP * self.bound
            for j in range(inc.shape[1]):  # a few steps a round; the members at once
                s = np.minimum(cap, np.maximum(0.0, s + inc[:, j]))
            self._groups[key] = (steps[new[-1]], s)
            self.stat.update(zip(key, s.tolist(), strict=True))
        return [r for r in key if self.stat.get(r, 0.0) >= self.bound]

    def feed(self, rank: int, steps: Sequence[int], over: Iterable[bool]) -> bool:
        """:meth:`feed_group` for one rank on its own. -> whether it passes the bound."""
        return bool(self.feed_group((rank,), steps, np.asarray([list(over)], dtype=bool)))

    def passed(self, rank: int) -> bool:
        """The rank's statistic is at or over the bound."""
        return self.bound > 0 and self.stat.get(rank, 0.0) >= self.bound
