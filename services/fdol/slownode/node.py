"""Node-level slow-node detection rounds (reference fdol.md §4).

:class:`NodeDetector` holds one job's local ranks on one node. Feed it :class:`StepMetrics` as the
reader produces them (:meth:`add`); call :meth:`round` every ``nSecondsDoOneDetection``. A round
returns ``None`` when the slowest local rank got no new step since the last round (§4.2 "not
updated"), else the node result (§4.6, plus faultmesh fields)::

    {"isSlow": 0|1, "degradationLevel": "35.12%"|"0.0%", "jobId": .., "nodeRank": <node ip>,
     "slowCalculateRanks": [..], "slowCommunicationDomains": [[..]], "slowSendRanks": [..],
     "slowHostNodes": [..], "slowIORanks": [..],
     # faultmesh:
     "suspectRanks": [..], "lastStep": int, "baselineReady": bool, "detectedBy": [..],
     "pattern": {"<rank>": [compute ratio, wait ratio|null]},
     "gapExcess" / "dpLag" / "lateShare": {"<rank>": the rules' scores (>= 1 flags) / share},
     "seqRanks": [..], "seqStat": {"<rank>": sequential statistic (passes at seqBound)},
     "sharedHostGroups": [[..]] (data-parallel groups on a shared host: long horizon only),
     "parallelGroups": {"<comm name>": {"group_name": "tp", "global_ranks": [..]}}}

Rules (§4.4–4.5): the step-time detector per rank gives the degradation (max over slow ranks);
only when it says slow are the boundaries computed: slow compute cards by homogenization of the
TP collective durations per TP group (or the time detector on ZP_device when no group has > 1
local rank), slow TP domains (every member slow on ZP_device against its own history), slow PP
links (PP send slower than history), slow host (every local rank slow on ZP_host), slow IO
(dataloader slower than history). Independently, the pattern detector (:mod:`.pattern`) flags
compute stragglers that step time does not show; its ranks join ``slowCalculateRanks`` and make
the result slow (``detectedBy`` says which rule fired). With faultmesh's rules, ranks without a
TP group are judged on their data-parallel collectives and expert all-to-alls (:mod:`.dp`).

Fixes of reference quirks (named on purpose), in addition to those of :mod:`.detect`:
- *slow IO*: computed on its own (the reference computed it only when the host was slow and then
  subtracted all host ranks, so it was always empty); ranks of a slow host are still excluded.
- *aligned homogenization*: TP collective durations are aligned by step number across the group
  (the reference truncated the lists to the shortest length keeping the *first* elements).
- *corroborated compute cards* (with the pattern detector on): a card flagged by homogenization
  (waits least in its TP collective) is kept only when its compute over the pattern window is also
  above its peers' by half the ``computeRatio`` margin (when enough compute samples exist); on a
  noisy box the rank that happened to arrive last in three steps was otherwise named.
- *applicability*: groups named ``cp``/``exp`` with > 1 rank are reported in ``notApplicable``
  instead of silently stopping the detector.
"""

from __future__ import annotations

import statistics
from collections import deque
from itertools import islice

from .detect import TimeDetector, homogenize
from .dp import DataParallelRules
from .featconf import FeatConf
from .forward import ForwardTimes
from .metrics import StepMetrics
from .pattern import PatternDetector
from .reader import Group, merge_groups
from .records import BadInput
from .results import empty_result, fmt_level, time_rises
from .sequential import StepEvidence

TIME_COLUMNS = ("step_time", "zp_device", "zp_host", "pp_device", "dataloader_host")
STALE_ROUNDS = 3  # rounds without a new step (others advancing) after which a rank is left out


class NodeDetector:
    """Node-level detection of one job on one node (see module doc).

    ``ranks``: the job's global ranks hosted here; ``node_ip``: the node's name in results;
    ``bad``: the job's bad-input counter (``rank_stopped``: a local rank without new steps for
    ``STALE_ROUNDS`` rounds while the others advance is left out of the rounds until it reports).
    """

    def __init__(self, conf: FeatConf, ranks: list[int], node_ip: str, bad: BadInput | None = None) -> None:
        self.conf = conf
        self.bad = bad if bad is not None else BadInput()
        self.ranks = sorted(set(ranks))
        self.node_ip = node_ip
        self._groups: dict[str, Group] = {}
        self._derived: tuple | None = None  # (tp groups, parallelGroups, notApplicable) of _groups
        self._groups_version = 0
        self.restarts = 0
        self._pending: dict[int, int] = {}  # rank -> its last step before a restart it has not made yet
        self._start()

    def _start(self) -> None:
        """Every per-run state: histories, time detectors, baselines, the rules' windows and
        sequential statistics (at construction, and again when the job restarts)."""
        conf = self.conf
        self._stale: dict[int, int] = {}  # rounds a rank got no new step while another did
        self._seen: dict[int, int] = {}  # each rank's last step at the previous round
        self._ready_for: tuple | None = None  # (ranks with data, groups version) with baselines ready
        keep = max(conf.pattern_window, conf.n_consec) * 3  # the history each rule reads
        keep = max(keep, conf.peer_window + 8, conf.normal_number + 3 * conf.time_window)
        self.history: dict[int, deque[StepMetrics]] = {r: deque(maxlen=keep) for r in self.ranks}
        self.faultmesh = conf.rules == "faultmesh"
        cap = 200 if self.faultmesh else 0
        win = conf.time_window if self.faultmesh else 0
        targs = (conf.normal_number, conf.n_sigma, conf.degradation_percentage, conf.n_consec, cap, win)
        self.detectors = {(r, c): TimeDetector(*targs) for r in self.ranks for c in TIME_COLUMNS}
        self._by_rank = {r: tuple(self.detectors[(r, c)] for c in TIME_COLUMNS) for r in self.ranks}
        self.forward = ForwardTimes(self.ranks, conf.normal_number, win, self.faultmesh)
        from .peers import GapDetector, PeerDetector  # numpy: only where detection runs (issue 18)

        self.peers = PeerDetector(conf.peer_window, conf.wait_asymmetry, conf.late_share, conf.wait_z)
        self.gaps = GapDetector(
            conf.peer_window, conf.gap_spread, conf.compute_excess, conf.wait_z,
            conf.gap_long_window, conf.gap_long_spread, StepEvidence(conf.seq_bound), conf.compute_shift,
        )  # fmt: skip
        shared = self.dp.shared() if hasattr(self, "dp") else []  # a restart: the same ranks share cores
        self.dp = DataParallelRules(
            conf.peer_window, conf.dp_lag_excess, self.bad, conf.dp_lag_spread, conf.seq_bound,
            (conf.gap_long_window, conf.dp_long_spread),
        )  # fmt: skip
        self.dp.keep_shared(shared)
        self.pattern = PatternDetector(conf.pattern_window, conf.compute_ratio, conf.wait_ratio)
        self.last_detected_step = -1
        self._prev_step = -1
        self.not_updated = 0
        self.rounds = 0
        self._coll_base: dict[tuple[int, ...], float] = {}  # TP group -> baseline collective time

    @property
    def groups(self) -> dict[str, Group]:
        """The merged parallel groups (comm name -> :class:`Group`); setting them replaces them."""
        return self._groups

    @groups.setter
    def groups(self, value: dict[str, Group]) -> None:
        old = self._groups
        if value == old:
            return  # set every round: nothing changed
        if any(k in old and old[k] != g for k, g in value.items()):  # a group's members changed
            self.bad.add("layout_changed")  # the steps so far ran on another layout: no verdict
            self._start()  # on them, the baselines start again
        self._groups = value
        self._derived = None
        self._groups_version += 1

    def _derive(self) -> tuple:
        """What the groups give every round, computed once per change of the groups: the detection
        groups, the ``parallelGroups`` of the results (one shared object) and ``notApplicable``."""
        if self._derived is None:
            local = set(self.ranks)
            tp: list[list[int]] = []
            for g in self._groups.values():
                if g.group_name == "tp" and len(g.global_ranks) > 1:
                    inter = sorted(local.intersection(g.global_ranks))
                    if inter and inter not in tp:
                        tp.append(inter)
            pg = {  # the data-parallel groups (whole-job lists) are kept out of the reports
                k: {"group_name": g.group_name, "global_ranks": list(g.global_ranks)}
                for k, g in self._groups.items()
                if g.group_name not in ("dp", "default_group")
            }
            na = [
                g.comm_name
                for g in self._groups.values()
                if g.group_name in ("cp", "exp") and len(g.global_ranks) > 1
            ]
            in_tp = {r for g in tp for r in g}
            dp = DataParallelRules.groups(self._groups, self.ranks, in_tp)
            self._derived = (tp or [[r] for r in self.ranks], pg, na, dp)
        return self._derived

    def set_rank_groups(self, per_rank: dict[int, dict[str, Group]]) -> None:
        """Merge the local ranks' parallel groups (tp/pp kept, §2 "group merge")."""
        merged = merge_groups(list(per_rank.values()), kinds=("tp", "pp", "cp", "exp", "dp", "default_group"))
        self.groups = merged

    def add(self, m: StepMetrics) -> None:
        """One completed step of a local rank (steps of one rank must come in order)."""
        h = self.history.get(m.rank)
        if h is None:
            return
        if m.rank in self._pending:  # the node restarted, this rank not yet: its old run is dropped
            if m.step >= self._pending[m.rank]:
                return
            del self._pending[m.rank]
        elif h and m.step <= h[-1].step:
            if m.step == h[-1].step:
                return
            self._restart(m.rank)  # steps start over: the job restarted
            h = self.history[m.rank]
        h.append(m)
        self.forward.add(m)
        for c in TIME_COLUMNS:
            v = m.zp_med or m.zp_device if c == "zp_device" and self.faultmesh else getattr(m, c)
            self.detectors[(m.rank, c)].add(float(v))

    def _restart(self, rank: int) -> None:
        """``rank``'s steps went back: the job restarted. Every baseline, window and statistic starts
        again; the other ranks' old-run records (step >= their last) are dropped until they restart."""
        self._pending = {r: h[-1].step for r, h in self.history.items() if h and r != rank}
        self.restarts += 1
        self._start()

    def tp_groups(self) -> list[list[int]]:
        """Detection groups: each TP group intersected with the local ranks; singletons without TP groups."""
        return [list(g) for g in self._derive()[0]]

    def baseline_ready(self) -> bool:
        """Step-time baselines formed for every rank with data, and ZP baselines for ranks in TP groups."""
        with_data = [r for r in self.ranks if self.history[r]]
        if not with_data:
            return False
        key = (tuple(with_data), self._groups_version)
        if key == self._ready_for:  # baselines, once formed, stay
            return True
        in_tp = {r for g in self.tp_groups() if len(g) > 1 for r in g}
        for r in with_data:
            if not self.detectors[(r, "step_time")].ready:
                return False
            if r in in_tp and not self.detectors[(r, "zp_device")].ready:
                return False
        self._ready_for = key
        return True

    def _live(self, ranks: list[int]) -> list[int]:
        """``ranks`` without those that stopped reporting: no new step for ``STALE_ROUNDS`` rounds
        while another local rank got one (counted ``rank_stopped`` once per stop). Their TP groups
        then have no aligned steps, so nothing is judged from the missing data."""
        last = {r: self.history[r][-1].step for r in ranks}
        moved = {r for r in ranks if last[r] > self._seen.get(r, -1)}
        for r in ranks:
            if r in moved:
                self._stale[r] = 0
            elif moved:  # the others advanced (all paused: nothing changes)
                self._stale[r] = self._stale.get(r, 0) + 1
                if self._stale[r] == STALE_ROUNDS:
                    self.bad.add("rank_stopped")
        self._seen = last
        return [r for r in ranks if self._stale.get(r, 0) < STALE_ROUNDS]

    def _slow(self, r: int, column: str) -> bool:
        return self.detectors[(r, column)].slow

    def round(self) -> dict | None:
        """One detection round; None when no new step data (see module doc)."""
        with_data = self._live([r for r in self.ranks if self.history[r]])
        if not with_data:
            return None
        low = min(self.history[r][-1].step for r in with_data)
        if low <= self.last_detected_step:
            self.not_updated += 1
            return None
        self.not_updated = 0
        self._prev_step = self.last_detected_step
        self.last_detected_step = low
        self.rounds += 1
        c = self.conf
        res = empty_result(c.job_id, self.node_ip)
        fired = []
        level = 0.0
        for r in with_data:
            st = self._by_rank[r][0]  # step_time
            if st.slow:
                level = max(level, st.degradation)
        groups = self.tp_groups()
        if self.faultmesh:
            return self._round_faultmesh(res, with_data, groups, level, low)
        calc: set[int] = set()
        pat = None
        if c.use_pattern:
            pat = self.pattern.evaluate(
                [g for g in groups if len(g) > 1], self.history, self.forward.baseline
            )
        if level > 0:
            fired.append("stepTime")
            multi = [g for g in groups if len(g) > 1]
            if multi:
                for g in multi:
                    cards = homogenize(
                        self._aligned_zp(g, low - max(c.pattern_window, c.n_consec)),
                        c.n_consec,
                        c.cluster_mean_distance,
                    )
                    if pat is not None:  # corroboration: a slow compute card also computes longest
                        rel = 1 + (c.compute_ratio - 1) / 2
                        cards = [r for r in cards if r not in pat.ratios or pat.ratios[r][0] > rel]
                    calc.update(cards)
            else:
                calc.update(r for r in with_data if self._slow(r, "zp_device"))
            res["slowCommunicationDomains"] = [
                g
                for g in multi
                if all(self.detectors[(r, "zp_device")].ready for r in g)
                and all(self._slow(r, "zp_device") for r in g)
            ]
            res["slowSendRanks"] = [r for r in with_data if self._slow(r, "pp_device")]
            host = with_data if all(self._slow(r, "zp_host") for r in with_data) else []
            res["slowHostNodes"] = [self.node_ip] if host else []
            res["slowIORanks"] = [r for r in with_data if self._slow(r, "dataloader_host") and r not in host]
        if pat is not None:
            if pat.flagged:
                fired.append("pattern")
                calc.update(pat.flagged)
                level = max(level, max(pat.ratios[r][0] - 1 for r in pat.flagged))
        res["slowCalculateRanks"] = sorted(calc)
        if fired:
            res["isSlow"] = 1
            res["degradationLevel"] = fmt_level(level)
        res["suspectRanks"] = pat.suspects if pat else []
        res["pattern"] = {str(r): list(v) for r, v in (pat.ratios.items() if pat else ())}
        res["detectedBy"] = fired
        return self._finish(res, low)

    def _finish(self, res: dict, low: int) -> dict:
        res["lastStep"] = low
        res["ranks"] = self.ranks
        res["baselineReady"] = self.baseline_ready()
        _, pg, na, _ = self._derive()
        res["parallelGroups"] = pg  # shared between rounds while the groups stay (read-only)
        res["notApplicable"] = list(na)
        return res

    def _round_faultmesh(
        self, res: dict, with_data: list[int], groups: list[list[int]], level: float, low: int
    ) -> dict:
        """faultmesh rules: every boundary judged on its own (no step-time gate), slow cards from
        the gaps between their TP collectives, else wait asymmetry (:mod:`.peers`); the result is
        slow only when it names something (a step-time degradation alone makes its ranks suspects:
        communication profiling on, no naming); cluster-wide suppression happens at cluster level.
        A card the gap rule flags stays named inside a slow TP domain (its compute against its peers is
        evidence the domain does not explain: a loaded box's slow collectives swallowed a x1.5 card)."""
        fired = ["stepTime"] if level > 0 else []
        multi = [g for g in groups if len(g) > 1]
        gap_cards, gap_scores, judged = self.gaps.evaluate(multi, self.history)
        cards, shares = self.peers.evaluate(
            [g for g in multi if tuple(sorted(g)) not in judged], self.history
        )
        # data-parallel collectives / expert all-to-alls where no TP group (:mod:`.dp`)
        dp_cards, dp_lag = self.dp.evaluate(self._derive()[3], set(with_data), self.history)
        cards = sorted(set(cards) | set(gap_cards) | set(dp_cards))  # gaps where measured, waits elsewhere
        seq = self.dp.passed() | {r for r in gap_cards if self.gaps.seq.passed(r)}
        by_rank = self._by_rank
        domains = [
            g
            for g in multi
            if all(by_rank[r][1].ready and by_rank[r][1].slow for r in g)  # zp_device
            and self._collective_slow(g)
        ]
        in_domain = {r for g in domains for r in g}
        cards = [r for r in cards if r not in in_domain or r in gap_cards]  # gap cards stay (docstring)
        sends, io, rise, host = self._per_rank(with_data)
        cards = [r for r in cards if r not in io]  # its late data arrives last at the TP barrier
        for name, hit in (
            ("gapExcess", [r for r in cards if r in gap_cards]),
            ("waitAsymmetry", [r for r in cards if r not in gap_cards and r not in dp_cards]),
            ("dpArrivalLag", [r for r in cards if r in dp_cards]),
            ("tpDomain", domains),
            ("ppSend", sends),
        ):
            if hit:
                fired.append(name)
        if host:
            fired.append("host")
        if io:
            fired.append("io")
        res["slowCalculateRanks"] = cards
        res["seqRanks"] = [r for r in cards if r in seq]  # passed the sequential bound (:mod:`.sequential`)
        if res["seqRanks"]:
            fired.append("sequential")
        res["slowCommunicationDomains"] = domains
        res["slowSendRanks"] = sends
        res["slowHostNodes"] = [self.node_ip] if host else []
        res["slowIORanks"] = io
        named = bool(cards or domains or sends or host or io)
        res["degradationLevel"] = fmt_level(level)
        if named:  # step-time degradation alone names nobody: it only makes suspects
            res["isSlow"] = 1
        suspects, res["forwardRise"] = self.forward.judge(with_data, set(cards), self.conf.node_rise)
        spreads = [self.forward.spread[r] for r in with_data if r in self.forward.spread]
        res["forwardSpread"] = round(max(spreads), 4) if spreads else None
        if level > 0 and not named:
            suspects = sorted(set(suspects) | {r for r in with_data if self._slow(r, "step_time")})
        res["suspectRanks"] = suspects
        res["lateShare"] = {str(r): v for r, v in shares.items()}
        res["gapExcess"] = {str(r): v for r, v in gap_scores.items()}
        res["dpLag"] = {str(r): v for r, v in dp_lag.items()}
        stat = {**self.dp.statistics(), **{r: v for r, v in self.gaps.seq.stat.items() if v > 0}}
        res["seqStat"] = {str(r): round(v, 2) for r, v in sorted(stat.items())}  # of the bound seqBound
        res["sharedHostGroups"] = self.dp.shared()  # data-parallel groups judged on the long horizon
        res["rise"] = rise
        res["explained"] = bool(cards or domains or host or sends)
        res["detectedBy"] = fired
        return self._finish(res, low)

    def _collective_slow(self, group: list[int]) -> bool:
        """The group's collectives themselves got slower: the median over the last
        ``timeWindowSteps`` aligned steps of the per-operation *least* wait (the last member to arrive
        waits only for the collective) is ``degradationPercentage`` above the same over the group's
        first ``normalNumber`` aligned steps. Every member's wait also rises when one member falls
        behind its peers (they wait for it) or a shared box's scheduler delays the members in turn;
        the least wait does not. True until the baseline exists (the members' rule stands alone)."""
        from .peers import collective_times

        key = tuple(sorted(group))
        c = self.conf
        base = self._coll_base.get(key)
        if base is None:
            vals = collective_times(key, self.history, c.normal_number, oldest=True)
            if len(vals) < c.normal_number:
                return True
            base = self._coll_base[key] = statistics.median(vals)
        recent = collective_times(key, self.history, c.time_window)
        if not recent or base <= 0:
            return True
        return statistics.median(recent) >= (1 + (c.degradation_percentage or 0.3)) * base

    def _per_rank(self, ranks: list[int]) -> tuple[list[int], list[int], dict, list[int]]:
        """The time detectors' verdicts of the round in one pass over ``ranks`` -> (slow PP
        senders, slow IO ranks, ``rise`` per rank, the ranks of a slow host or []).

        - slow host: every local rank (> 1) slow on its TP launch (``zp_host``); its ranks are not
          slow IO ranks. Not from a host-only producer (:meth:`_host_is_device`): its ``zp_host``
          is its ``zp_device``, read already by the TP-domain rule;
        - slow IO: the data-loader detector is slow and the rise costs ``ioShare`` of the step (a
          loader twice as slow that takes 1 % of the step is not what slows the job);
        - ``rise``: ``{"<rank>": {"zp": .., "zpSpread": .., "host": .., "hostSpread": ..}}``, the
          recent TP wait (``zp``) and TP launch (``host``) over their baselines (window median /
          mean; None before the baseline) and the baselines' relative spread (std / mean): the
          cluster compares a slow TP domain's or host's rise with the other ranks' (a box-wide
          load swing raises every rank's), with two nodes beyond ``nSigma`` spreads."""
        sends: list[int] = []
        io: list[int] = []
        host_all = len(ranks) > 1
        share = self.conf.io_share
        by_rank = self._by_rank
        for r in ranks:
            st, zp, zh, pp, dl = by_rank[r]  # TIME_COLUMNS order
            if pp.slow:
                sends.append(r)
            host_all = host_all and zh.slow and not self._host_is_device(r)
            if dl.slow:
                step = st.recent()
                if step > 0 and dl.recent() - dl.mean >= share * step:
                    io.append(r)
        host = list(ranks) if host_all else []
        return sends, [r for r in io if not host_all], time_rises(self._by_rank, ranks), host

    def _host_is_device(self, rank: int) -> bool:
        """True when the rank's last ``timeWindowSteps`` steps carry the same TP time on the host
        as on the device, step for step (a CPU job, e.g. gloo: host and device timestamps are the
        same clock and the same ranges, so there is no separate host side to find slow)."""
        tail = islice(reversed(self.history[rank]), self.conf.time_window)
        return all(m.zp_host == m.zp_device for m in tail)

    def _aligned_zp(self, group: list[int], after_step: int) -> list[dict[int, float]]:
        """Per step (> ``after_step``, chronological) {rank: ZP_device} where every member has a value."""
        by_step: dict[int, dict[int, float]] = {}
        for r in group:
            for m in self.history[r]:
                if m.zp_device > 0 and m.step > after_step:
                    by_step.setdefault(m.step, {})[r] = float(m.zp_device)
        return [by_step[s] for s in sorted(by_step) if len(by_step[s]) == len(group)]
