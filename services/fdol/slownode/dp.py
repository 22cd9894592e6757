"""faultmesh's slow-card rules on data-parallel collectives, for ranks without a TP group (issue 34).

Pure data-parallel and FSDP jobs (the most common PyTorch training jobs) have no TP group, so the
TP rules of :mod:`.peers` see nothing. Their ranks meet at every data-parallel collective instead:
DDP's gradient all-reduce buckets, FSDP's per-layer all-gathers and reduce-scatters. A card that
computes slower issues each of them later than its peers (FALCON / Greyhound ATC'25, Holmes and
Minder NSDI'25 localize slow GPUs the same way). The parse stage records, per collective, when the
rank arrived (``StepMetrics.dp_starts``: its start from the step's start; :mod:`.metrics`).

Rule (arrival lag), per data-parallel group intersected with the node's ranks (>= 2 members), over
the last ``peerWindowSteps`` steps where every member has the same number of such collectives:
per collective, a member's lag is log(own arrival) - the median of the other members' log
arrivals: how much longer it took, relative to its peers, to get from the step's start to that
collective. A member is *flagged* when the median of its lags over the window's collectives, or
over the last ``peerWindowSteps // 4`` steps', reaches ``dpLagExcess`` (0.03) and, in a group of
>= 4 members, ``dpLagSpread`` (3.0) robust spreads of the members' window medians (1.4826 x
their median absolute deviation): slow relative to how much its own peers differ.

Why the median of a relative lag, and not who arrives last (the TP sign test) or the compute gap
before each collective (the TP gap rule):

- collectives run on their own stream and overlap the compute, so a member that is ahead queues
  its next collective behind the one that waits for the late member: its gaps read 0 and its waits
  carry the late member's delay, not its own time; its arrivals stay its own until it is held up;
- in a healthy job the same card is the last to arrive nearly every time: cards of one model
  differ by a few percent in sustained speed (Sinha et al. SC'22) and the lag accumulates over the
  backward. Who is last says nothing without how much: the relative lag does (it is its speed
  difference to its peers). 0.03 sits between a healthy fleet's spread and the +5 % straggler
  the issue names, for the spread bench/trainsim_dp.py models (1 % standard deviation, cards
  beyond 2.5 % screened out by acceptance tests), not one measured on a fleet; where the cards
  differ more (bench/slownode_dp.py --card-sd 0.02: up to 5 %) the innately slowest one passed it
  in 10 of 20 culprit-free jobs, and the spread term keeps it quiet (0 of 20) -- a +5 % card is
  then within the fleet's own spread and not named, a +20 % one is;
- the median needs the lag in most of the collectives over the window: a step with an OS hiccup,
  or mixture-of-experts routing that makes a few random ranks late in one layer and step and
  others in the next (the expert all-to-alls realign the members within each layer), do not move
  it.

Mixture-of-experts jobs (expert parallel, ``exp`` groups): the expert all-to-alls block the compute
and release their group together, so the lag since the step's start is diluted in every layer;
there the same median rule judges each rank's own compute between its all-to-alls
(``StepMetrics.ep_gaps``: log(own gap) - the median of the other members' log gaps, per EP group
intersected with the node's ranks). Token routing makes a few random ranks compute their experts
longer in each layer and step (FasterMoE PPoPP'22, Tutel MLSys'23): in a minority of the
operations, which the median ignores; a slow card is slower in all of them.

Shared hosts. Where ranks share CPU cores with each other and with other work, the scheduler holds
a healthy rank about x2 behind its peer for 5-25 steps at a time (~20 % of the steps), a step's
lag wanders by ~0.11 outside those bursts and two ranks' cores differ innately by up to 3.4 %
(the real 2-rank DDP job on the 2-core box, tests/e2e/test_slownode_ddp.py, 19 recorded clean
runs): replayed with the defaults and 0.5 s rounds, the window rule, the short window and the
per-step sequential test (:mod:`.sequential`) named a healthy rank in every one of them. A group
whose *step jitter* -- the median over members of the robust spread (interquartile range / 1.349)
of the change of a step's median lag from one step to the next, / sqrt 2, over the kept horizon
(up to ``gapLongWindowSteps`` steps, from ``window // 4`` on) -- exceeds ``SHARED_STEP`` (1.0) x
``dpLagExcess`` is on a shared host for the rest of the run and after a restart on that node
(its ranks do not move; a slow card's onset is one change, not a spread): on a cluster it is 0.006-0.009 (bench/trainsim_dp.py, every
kind, MoE included), on the box 0.014-0.8, over 0.03 in every one of 39 recorded runs by its
10th-17th step. Such a group feeds no step to the sequential test and is judged on its long horizon only:
a member is flagged when the interquartile mean of its steps' lags over the last
``gapLongWindowSteps`` (160) steps reaches ``max(threshold, dpLongSpread x s)``, ``s`` the same
robust spread of the lags themselves (bursts included) and ``dpLongSpread`` 1.0: a burst lasts
tens of steps, a slow card every step. On the 19 clean recordings the highest score was 0.63
(0.84 at 0.75 spreads, 1.26 at 0.5); the recorded slowed runs (+20 % compute or more, raised
until it stood out of the box's noise) were named 188-496 steps after the job began (those the
recording ran long enough for). The node result lists such groups in ``sharedHostGroups``.

Steps where the members recorded different numbers of collectives (a missing record) are left
out and counted (``missing_collectives``); a member that stopped reporting is left out of its
group (the node counts ``rank_stopped``): no verdict on missing data, never a confirmation.

The groups: the rank's ``dp`` groups, else (a job that labels none, e.g. plain DDP, and has no
PP groups) the default group. Ranks of a multi-member local TP group are judged by the TP rules
only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING

from .metrics import StepMetrics
from .reader import Group
from .records import BadInput
from .sequential import MARGIN, StepEvidence

if TYPE_CHECKING:
    import numpy as np


def local_dp_groups(
    groups: dict[str, Group],
    local: Sequence[int],
    in_tp: set[int],
    kinds: Sequence[str] = ("dp", "default_group"),
) -> list[list[int]]:
    """The detection groups of the rule: each group of the first of ``kinds`` that has any (``dp``,
    else the default group; ``("exp",)``: the expert-parallel groups) intersected with the
    ``local`` ranks not in ``in_tp``, those with >= 2 members, deduplicated, sorted. The default
    group leaves out the ranks of PP groups (it would compare different pipeline stages)."""
    free = set(local) - in_tp
    out: list[list[int]] = []
    for kind in kinds:
        if kind == "default_group":
            free -= {
                r
                for g in groups.values()
                if g.group_name == "pp" and len(g.global_ranks) > 1
                for r in g.global_ranks
            }
        for g in groups.values():
            if g.group_name == kind and len(g.global_ranks) > 1:
                inter = sorted(free.intersection(g.global_ranks))
                if len(inter) > 1 and inter not in out:
                    out.append(inter)
        if out:
            break
    return sorted(out)


MIN_SPREAD_MEMBERS = 4  # members below which the group's own spread is not estimated
SHARED_STEP = 1.0  # a step's lag jitter over this x dpLagExcess: a shared host (module doc)


class ArrivalLagDetector:
    """The median-lag rule (module doc). ``window``: steps judged (``peerWindowSteps``);
    ``excess``: the least median relative lag that flags (``dpLagExcess``); ``bad``: counts
    ``missing_collectives`` (steps left out because members recorded different numbers);
    ``evidence``: the StepMetrics field judged (``dp_starts``: arrivals since the step's start;
    ``ep_gaps``: compute between the expert all-to-alls); ``spread``: ``dpLagSpread`` (0: off)."""

    def __init__(
        self,
        window: int = 40,
        excess: float = 0.03,
        bad: BadInput | None = None,
        evidence: str = "dp_starts",
        spread: float = 3.0,
        seq: StepEvidence | None = None,
        long_window: int = 160,
        long_spread: float = 1.0,
    ) -> None:
        self.seq = seq if seq is not None else StepEvidence(0)
        self.spread = spread
        self.evidence = evidence
        self.window = window
        self.short = max(2, window // 4)
        self.excess = excess
        self.long_window = long_window if long_spread > 0 and long_window > window else 0
        self.long_spread = long_spread
        self.bad = bad if bad is not None else BadInput()
        self._counted: dict[tuple[int, ...], int] = {}  # group -> last step checked for missing records
        # group -> (last step kept, each kept step's [members] median lag: the horizon)
        self._horizon: dict[tuple[int, ...], tuple[int, deque[np.ndarray]]] = {}
        self.shared: set[tuple[int, ...]] = set()  # groups found on a shared host (module doc), for good

    def evaluate(
        self, groups: Sequence[Sequence[int]], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float]]:
        """-> (flagged ranks, {rank: score: its median lag over the threshold, the larger of the
        window and the short window -- on a shared host its long horizon's; >= 1 flags}). The window
        rule judges a full ``window``; from ``window // 4`` aligned steps on, each step also feeds the
        sequential test (``seq``, :mod:`.sequential`: the step's median lag over ``MARGIN`` x the
        same threshold), whose passing ranks are flagged too. A group found on a shared host (module
        doc) is judged on its long horizon only."""
        import numpy as np  # numpy: only where detection runs (issue 18)

        from .peers import excess_rows
        from .robust import iqm_iqr, median_spread

        flagged: list[int] = []
        scores: dict[int, float] = {}
        for group in groups:
            key = tuple(sorted(group))
            rows, steps = self._aligned(key, history)
            if len(rows) < self.short:
                continue
            arr = np.asarray(rows, dtype=np.float32)  # [steps, members, ops]
            k = arr.shape[2]
            flat = arr.transpose(1, 0, 2).reshape(len(key), -1)
            lag = excess_rows(flat)  # [members, valid ops]
            if lag.shape[1] < 2 * k:
                continue
            valid = (flat > 0).all(axis=0).reshape(len(rows), k).sum(axis=1)
            nums = [st for st, v in zip(steps, valid.tolist(), strict=True) if v]
            if valid.min() == k:  # the usual case: every op measured
                per_step = np.median(lag.reshape(len(key), len(rows), k), axis=2)  # [members, steps]
            else:
                parts = np.split(lag, np.cumsum(valid)[:-1], axis=1)
                per_step = np.stack([np.median(p, axis=1) for p in parts if p.shape[1]], axis=1)
            hz = self._keep(key, nums, per_step)  # [members, kept steps]
            med = np.median(lag, axis=1)
            thr = self.excess
            if self.spread > 0 and len(key) >= MIN_SPREAD_MEMBERS:  # the members' own spread of speed
                thr = max(thr, self.spread * 1.4826 * float(np.median(np.abs(med - np.median(med)))))
            s = 0.0
            if hz.shape[1] >= self.short:
                hz_iqm, hz_iqr = iqm_iqr(hz)
                s = median_spread(hz_iqr)  # how far a step's lag wanders (bursts included)
                jitter = median_spread(iqm_iqr(np.diff(hz, axis=1))[1]) / math.sqrt(2)  # step to step
                if jitter > SHARED_STEP * self.excess:
                    self.shared.add(key)
            shared = key in self.shared
            if self.seq.bound > 0:  # each step's median lag over the threshold: the sequential test
                over = per_step >= MARGIN * thr
                if shared:  # ranks sharing CPU cores: a step is no evidence (:mod:`.sequential`)
                    over[:] = False
                flagged += self.seq.feed_group(key, nums, over)
            if shared:
                if self.long_window and hz.shape[1] >= self.long_window:
                    score = hz_iqm / max(thr, self.long_spread * s)
                    self._score(key, score, scores, flagged)
                continue
            if len(rows) < self.window:
                continue
            short = lag[:, -min(lag.shape[1], self.short * k) :]
            self._score(key, np.maximum(med, np.median(short, axis=1)) / thr, scores, flagged)
        return sorted(set(flagged)), scores

    @staticmethod
    def _score(key: tuple[int, ...], score, scores: dict[int, float], flagged: list[int]) -> None:
        for r, v in zip(key, score.tolist(), strict=True):
            scores[r] = round(v, 3)
            if v >= 1:
                flagged.append(r)

    def _keep(self, key: tuple[int, ...], nums: list[int], per_step):
        """Add the group's new steps (``nums``, chronological; ``per_step`` [members, steps]) to its
        horizon (the last ``max(window, long_window)`` steps) -> the horizon, [members, steps]."""
        import numpy as np

        last, kept = self._horizon.get(key) or (-1, deque(maxlen=max(self.window, self.long_window)))
        for i, st in enumerate(nums):
            if st > last:
                kept.append(per_step[:, i])
        self._horizon[key] = (max(last, nums[-1]) if nums else last, kept)
        return np.stack(kept, axis=1) if kept else per_step[:, :0]

    def _aligned(
        self, key: tuple[int, ...], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[list[tuple]], list[int]]:
        """The last ``window`` steps (chronological) every member has with the same non-zero number
        of arrivals: (per step [member][op], their step numbers); steps where the members' numbers
        differ are counted once (``missing_collectives``)."""
        by_step: dict[int, dict[int, tuple[int, ...]]] = {}
        for r in key:
            for m in islice(reversed(history.get(r, ())), self.window + 8):
                by_step.setdefault(m.step, {})[r] = getattr(m, self.evidence)
        seen = self._counted.get(key, -1)
        out = []
        nums = []
        missing = 0
        for st in sorted(by_step):
            vec = by_step[st]
            if len(vec) < len(key):
                continue  # a member without this step (stopped, or not read yet): no verdict on it
            lens = {len(v) for v in vec.values()}
            if len(lens) == 1 and 0 not in lens:
                out.append([vec[r] for r in key])
                nums.append(st)
            elif lens != {0} and st > seen:
                missing += 1
        if by_step:
            self._counted[key] = max(seen, max(by_step))
        if missing:
            self.bad.add("missing_collectives", missing)
        return out[-self.window :], nums[-self.window :]


class DataParallelRules:
    """The rule on the data-parallel collectives (``dp_starts``) and on the expert all-to-alls
    (``ep_gaps``) of the node's ranks without a TP group, with the keys ``peerWindowSteps``,
    ``dpLagExcess``, ``dpLagSpread``, ``seqBound`` and, for groups on a shared host,
    ``gapLongWindowSteps`` / ``gapLongSpread`` (``long``); ``bad`` counts ``missing_collectives``."""

    def __init__(
        self,
        window: int,
        excess: float,
        bad: BadInput,
        spread: float = 3.0,
        seq_bound: float = 0.0,
        long: tuple[int, float] = (160, 1.0),
    ) -> None:
        self.dp = ArrivalLagDetector(window, excess, bad, "dp_starts", spread, StepEvidence(seq_bound), *long)
        self.ep = ArrivalLagDetector(window, excess, bad, "ep_gaps", spread, StepEvidence(seq_bound), *long)

    def passed(self) -> set[int]:
        """Ranks whose sequential statistic (:mod:`.sequential`) passed the bound, on either rule."""
        return {r for d in (self.dp, self.ep) for r in d.seq.stat if d.seq.passed(r)}

    def statistics(self) -> dict[int, float]:
        """{rank: its sequential statistic, the higher of the two rules'} for ranks above 0."""
        out: dict[int, float] = {}
        for d in (self.dp, self.ep):
            for r, v in d.seq.stat.items():
                if v > 0:
                    out[r] = max(v, out.get(r, 0.0))
        return out

    def keep_shared(self, groups: list[list[int]]) -> None:
        """Take ``groups`` as found on a shared host (a restarted job on the same node: its ranks
        still share the cores), before any step of the new run is judged."""
        for d in (self.dp, self.ep):
            d.shared.update(tuple(g) for g in groups)

    def shared(self) -> list[list[int]]:
        """The groups found on a shared host (judged on their long horizon only; module doc)."""
        return [list(g) for g in sorted({g for d in (self.dp, self.ep) for g in d.shared})]

    @staticmethod
    def groups(
        groups: dict[str, Group], local: Sequence[int], in_tp: set[int]
    ) -> tuple[list[list[int]], ...]:
        """(data-parallel groups, expert-parallel groups) of the ``local`` ranks not in ``in_tp``."""
        return local_dp_groups(groups, local, in_tp), local_dp_groups(groups, local, in_tp, ("exp",))

    def evaluate(
        self, groups: tuple[list[list[int]], ...], live: set[int], history: dict[int, Sequence[StepMetrics]]
    ) -> tuple[list[int], dict[int, float]]:
        """-> (flagged ranks, {rank: its highest score}); ``groups`` from :meth:`groups`, members not
        in ``live`` (stopped reporting) left out."""
        cards: set[int] = set()
        scores: dict[int, float] = {}
        for det, gs in zip((self.dp, self.ep), groups, strict=True):
            flagged, sc = det.evaluate([x for g in gs if len(x := [r for r in g if r in live]) > 1], history)
            cards.update(flagged)
            for r, v in sc.items():
                scores[r] = max(v, scores.get(r, v))
        return sorted(cards), scores
