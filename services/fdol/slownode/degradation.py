"""Slow-node confirmation (reference fdol.md §6): :class:`DegradationTracker`, the state machine that
turns one job's cluster rounds (:func:`fdol.slownode.cluster.merge_cluster` results) into the
host's actions (:class:`Action`: communication profiling on/off, confirm, report, recover). Pure: no
I/O, no clock; the faultmesh differences are named in the class docstring."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .featconf import FeatConf


@dataclass
class Action:
    """One thing the host must do: ``kind`` in heavy_on | heavy_off | confirm | report | recover."""

    kind: str
    ranks: list[int] = field(default_factory=list)
    detail: dict = field(default_factory=dict)


NAMED_KEYS = (
    "slowCalculateRanks",
    "slowCommunicationDomains",
    "slowHostNodes",
    "slowIORanks",
    "slowSendRanks",
)


def _names_any(result: dict) -> bool:
    """The cluster result names some entity (:data:`NAMED_KEYS`)."""
    return any(result.get(k) for k in NAMED_KEYS)


class DegradationTracker:
    """Confirmation state machine of §6 for one job (pure; the host performs the actions).

    State: ``heavy`` (communication profiling on) with ``heavy_reason`` (initial | slow | suspect),
    ``degraded``, ``slow_rounds`` (consecutive slow rounds), ``reported_ranks``. Call
    :meth:`on_round` with each cluster result; it returns the actions in order.

    As the reference: the first slow round switches communication profiling on; after
    ``nConsecSlowRoundsToConfirm`` consecutive slow rounds the degradation is confirmed and
    communication profiling goes off again; a round that is not slow resets the count.
    faultmesh differences (named on purpose):

    - *ranks across the confirming rounds*: the reported slow ranks are those localized in at least
      half of the confirming rounds that named anything of any kind (the reference reported the last
      round's ranks, so one noisy round could name a wrong rank, and a last round that localized
      nothing reported nobody); without such ranks the report is deferred (and communication
      profiling kept on) until the rounds agree. The confirm action's ``detail`` names the other
      entities the same way (``slowCommunicationDomains``, ``slowHostNodes``, ``slowIORanks``,
      ``slowSendRanks`` via the domains);
    - *gap tolerance* (``confirmGapRounds``, rules ``faultmesh``): up to ``gap`` clean rounds
      inside a run of slow rounds do not restart the count (intermittent slowness, a round that
      happened to be clean still leads to the confirmation and its report);
    - *recovery hysteresis*: a confirmed degradation recovers only after as many consecutive clean
      rounds (neither slow nor suspect) as it took to confirm (the reference recovered on the first
      clean round, so a straggler flapped between fault and recovery);
    - *initial phase bounded*: communication profiling of the initial phase goes off once every node
      has its baselines, or after ``initial_max_rounds`` rounds (a node that never gets TP data);
    - *communication profiling always on* (``commProfiling`` ``always``, the default of rules
      ``faultmesh``): no heavy_on/heavy_off actions, ``heavy`` stays true (reason ``always``);
    - *sequential confirmation* (rules ``faultmesh``, ``seqBound`` > 0): a slow round whose
      ``seqRanks`` (slow cards whose evidence across steps passed the bound,
      :mod:`fdol.slownode.sequential`) is not empty confirms at once and reports those ranks,
      without waiting for ``nConsecSlowRoundsToConfirm`` rounds; once confirmed, a further rank
      that passes the bound is reported too (two slow cards: the report names all reported ranks,
      so a node's fault lists every slow rank it hosts);
    - *suspects*: rounds with ``suspectRanks`` switch communication profiling on, or keep it on after
      slow rounds, to localize (at most ``suspect_max_rounds`` rounds, then a cooldown of
      ``suspect_cooldown_rounds``); the reference switched it off on the first round that was not
      slow, so a straggler near the thresholds made profiling flap and never got 5 rounds of data.
    """

    def __init__(
        self,
        conf: FeatConf,
        suspect_max_rounds: int = 10,
        suspect_cooldown_rounds: int = 30,
        initial_max_rounds: int = 60,
    ) -> None:
        self.conf = conf
        self.initial_max_rounds = initial_max_rounds
        self._initial_rounds = 0
        self.heavy = True
        self.heavy_reason = "always" if conf.comm_always else "initial"
        self.degraded = False
        self.slow_rounds = 0
        self.clean_rounds = 0
        self.gap_rules = conf.rules == "faultmesh"
        self.gap = conf.confirm_gap if self.gap_rules else 0
        # per recent slow round: (its slow ranks, whether it named anything of any kind)
        self.history: deque[tuple[list[int], bool]] = deque(maxlen=conf.n_confirm_rounds)
        self.results: deque[dict] = deque(maxlen=conf.n_confirm_rounds)
        self._gaps = 0  # clean rounds tolerated in the current run of slow rounds
        self.reported_ranks: list[int] = []
        self.deferred = False
        self.suspect_max_rounds = suspect_max_rounds
        self.suspect_cooldown_rounds = suspect_cooldown_rounds
        self._suspect_rounds = 0
        self._cooldown = 0

    def _heavy(self, on: bool, reason: str, out: list[Action]) -> None:
        if self.conf.comm_always:
            self.heavy, self.heavy_reason = True, "always"  # commProfiling always: never switched
            return
        if on and not self.heavy:
            out.append(Action("heavy_on"))
        elif not on and self.heavy:
            out.append(Action("heavy_off"))
        self.heavy = on
        self.heavy_reason = reason if on else ""

    def majority_ranks(self) -> list[int]:
        """Ranks localized in at least half of the recent slow rounds that named anything (a rank,
        a domain, a host, an IO rank or a PP sender): a slow data loader named in every round does
        not turn into a slow card its TP partner's noise put in one of them."""
        localized = [set(r) for r, named in self.history if named]
        if not any(localized):
            return []
        counts: dict[int, int] = {}
        for s in localized:
            for r in s:
                counts[r] = counts.get(r, 0) + 1
        return sorted(r for r, c in counts.items() if 2 * c >= len(localized))

    def detail(self) -> dict:
        """Entities named in at least half of the recent slow rounds that named any of that kind."""
        out: dict[str, list] = {}
        for key in ("slowCommunicationDomains", "slowHostNodes", "slowIORanks"):
            rounds = [
                {tuple(x) if isinstance(x, list) else x for x in r.get(key) or ()} for r in self.results
            ]
            rounds = [x for x in rounds if x]
            counts: dict = {}
            for x in rounds:
                for e in x:
                    counts[e] = counts.get(e, 0) + 1
            out[key] = sorted(
                (list(e) if isinstance(e, tuple) else e for e, c in counts.items() if 2 * c >= len(rounds)),
                key=str,
            )
        return out

    def on_round(self, result: dict, baseline_ready: bool = True) -> list[Action]:
        """Process one cluster result (:func:`merge_cluster`); ``baseline_ready``: every node reported it."""
        out: list[Action] = []
        if self._cooldown:
            self._cooldown -= 1
        slow = result.get("isSlow") == 1
        suspects = result.get("suspectRanks") or []
        ranks = list(result.get("slowCalculateRanks") or [])
        seq = [r for r in result.get("seqRanks") or () if r in ranks] if self.gap_rules else []
        if self.degraded:
            if slow or suspects:
                self.clean_rounds = 0
                if slow:
                    self.history.append((ranks, _names_any(result)))
                if new := [r for r in seq if r not in self.reported_ranks and not self.deferred]:
                    self.reported_ranks = sorted({*self.reported_ranks, *new})  # a second slow card:
                    out.append(Action("report", list(self.reported_ranks)))  # all of them, per node
                if self.deferred and (maj := self.majority_ranks()):
                    self.deferred = False
                    self.reported_ranks = maj
                    out.append(Action("report", maj))
                    self._heavy(False, "", out)
                return out
            self.clean_rounds += 1
            if self.clean_rounds >= self.conf.n_confirm_rounds:
                self.degraded = False
                self.deferred = False
                self.slow_rounds = 0
                self.history.clear()
                self.results.clear()
                out.append(Action("recover", self.reported_ranks))
                self.reported_ranks = []
                self._heavy(False, "", out)
            return out
        if not slow and self.slow_rounds and self._gaps < self.gap:
            self._gaps += 1  # a clean round inside a run of slow rounds (gap tolerance)
            return out
        if not slow:
            self._gaps = 0
            self.slow_rounds = 0
            self.history.clear()
            self.results.clear()
            if self.heavy and self.heavy_reason != "always":
                if self.heavy_reason == "initial":
                    self._initial_rounds += 1
                    if baseline_ready or self._initial_rounds >= self.initial_max_rounds:
                        self._heavy(False, "", out)
                elif suspects:  # a straggler is still suspected: keep localizing (bounded)
                    if self.heavy_reason != "suspect":
                        self.heavy_reason = "suspect"
                        self._suspect_rounds = 0
                    self._suspect_rounds += 1
                    if self._suspect_rounds >= self.suspect_max_rounds:
                        self._cooldown = self.suspect_cooldown_rounds
                        self._heavy(False, "", out)
                else:
                    self._heavy(False, "", out)
            elif suspects and not self._cooldown:
                self._suspect_rounds = 0
                self._heavy(True, "suspect", out)
            return out
        self.slow_rounds += 1
        self.history.append((ranks, _names_any(result)))
        self.results.append(result)
        if not self.heavy:
            self._heavy(True, "slow", out)
            if self.slow_rounds < self.conf.n_confirm_rounds and not seq:
                return out
        if self.heavy_reason != "always":
            self.heavy_reason = "slow"
        if seq or self.slow_rounds >= self.conf.n_confirm_rounds:
            self.degraded = True
            self._gaps = 0
            self.clean_rounds = 0
            maj = sorted(seq) if seq else self.majority_ranks()
            out.append(Action("confirm", maj, self.detail()))
            if maj:
                self.reported_ranks = maj
                out.append(Action("report", maj))
                self._heavy(False, "", out)
            else:
                self.deferred = True  # keep communication profiling on until the ranks agree
        return out
