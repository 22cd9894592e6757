"""Cluster-level slow-node detection and confirmation (reference fdol.md §5–6).

:func:`merge_cluster` merges the node results that changed since the last round (§5 steps 3–8);
:func:`pp_link_analysis` is the PP link rule (§5 step 6). :class:`ClusterDetector` keeps the latest
node result per node and runs rounds. :class:`DegradationTracker` is the confirmation state
machine of §6 (first slow round switches communication profiling on; confirmation after
``nConsecSlowRoundsToConfirm`` consecutive slow rounds; recovery when a round is not slow).

Fixes of reference quirks / faultmesh additions (named on purpose):
- *isSlow*: a cluster round is slow when a merged node result is slow (the reference compared the
  degradation string with "0.0" while node results carry "0.0%").
- *PP link result kept*: ``slowCommunicationRanks`` carries the PP link analysis (the reference
  computed it and blanked it).
- *groups from node reports*: TP/PP groups come from the ``parallelGroups`` of the node reports
  (merged like ``parallel_group_global.json``) instead of a shared filesystem.
- *suspects*: node ``suspectRanks`` (compute straggler pattern without TP wait data) switch
  communication profiling on without counting as a slow round, and keep a confirmed degradation
  from being reported as recovered while communication profiling is off again.
- *initial phase*: communication profiling starts on (as the reference's StartAllProfiling) and is
  switched off once every node reports ``baselineReady``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .featconf import FeatConf
from .node import fmt_level


def _level(s: str) -> float:
    try:
        return float(str(s).rstrip("%")) / 100
    except ValueError:
        return 0.0


def pp_link_analysis(pp_group: list[int], slow_send_ranks: list[int]) -> list[int]:
    """Ranks of ``pp_group`` (ordered stages) whose links are all bad (§5 step 6).

    Capacity 1 at the ends, 2 inside; a slow sender at index i (not last) marks links of i and i+1;
    a rank is abnormal when its ratio is 1 and a neighbour's is 0.5 (index 0 looks right, the last
    left). Golden values (reference test): sends [1,2,3] on [1..6] -> [3]; sends [1] -> [1].
    """
    n = len(pp_group)
    if n < 2:
        return []
    bad = [0] * n
    pos = {r: i for i, r in enumerate(pp_group)}
    for r in slow_send_ranks:
        i = pos.get(r)
        if i is None or i == n - 1:
            continue
        bad[i] += 1
        bad[i + 1] += 1
    cap = [1 if i in (0, n - 1) else 2 for i in range(n)]
    ratio = [b / c for b, c in zip(bad, cap, strict=True)]
    out = []
    for i in range(n):
        if ratio[i] != 1:
            continue
        neigh = [i + 1] if i == 0 else [i - 1] if i == n - 1 else [i - 1, i + 1]
        if any(ratio[j] == 0.5 for j in neigh):
            out.append(pp_group[i])
    return out


def merge_groups_json(reports: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """TP and PP groups (global ranks, stage order) from node reports' ``parallelGroups``."""
    merged: dict[str, tuple[str, set[int]]] = {}
    for rep in reports:
        for key, g in (rep.get("parallelGroups") or {}).items():
            if not isinstance(g, dict) or g.get("group_name") not in ("tp", "pp"):
                continue
            ranks = g.get("global_ranks") or []
            if not all(type(r) is int for r in ranks):
                continue
            merged.setdefault(key, (g["group_name"], set()))[1].update(ranks)
    tp = [sorted(r) for _, (n, r) in sorted(merged.items()) if n == "tp"]
    pp = [sorted(r) for _, (n, r) in sorted(merged.items()) if n == "pp"]
    return tp, pp


def merge_cluster(job_id: str, cluster_ip: str, changed: list[dict], all_reports: list[dict]) -> dict:
    """Merge changed node results into the cluster result (§5). Keys as the reference plus
    ``suspectRanks`` and ``slowNodes`` (nodes whose result was slow)."""
    tp_groups, pp_groups = merge_groups_json(all_reports)
    calc: list[int] = []
    io: list[int] = []
    hosts: list[str] = []
    domains: list[list[int]] = []
    sends: list[int] = []
    suspects: list[int] = []
    level = 0.0
    slow = False
    slow_nodes = []
    for res in changed:
        suspects.extend(res.get("suspectRanks") or [])
        if res.get("isSlow") != 1:
            continue
        slow = True
        slow_nodes.append(res.get("nodeRank", ""))
        calc.extend(res.get("slowCalculateRanks") or [])
        io.extend(res.get("slowIORanks") or [])
        hosts.extend(res.get("slowHostNodes") or [])
        domains.extend(res.get("slowCommunicationDomains") or [])
        sends.extend(res.get("slowSendRanks") or [])
        level = max(level, _level(res.get("degradationLevel", "0.0%")))
    in_domains = {r for d in domains for r in d}
    tp_slow = [g for g in tp_groups if g and all(r in in_domains for r in g)]
    pp_slow: list[list[int]] = []
    for r in sorted(set(sends)):
        for g in pp_groups:
            if r in g:
                i = g.index(r)
                if i < len(g) - 1:
                    pp_slow.append([g[i], g[i + 1]])
                break
    comm_ranks = sorted({r for g in pp_groups for r in pp_link_analysis(g, sorted(set(sends)))})
    return {
        "isSlow": 1 if slow else 0,
        "degradationLevel": fmt_level(level),
        "jobId": job_id,
        "nodeRank": cluster_ip,
        "slowCalculateRanks": sorted(set(calc)),
        "slowCommunicationDomains": tp_slow + pp_slow,
        "slowHostNodes": sorted(set(hosts)),
        "slowIORanks": sorted(set(io)),
        "slowCommunicationRanks": comm_ranks,
        "suspectRanks": sorted(set(suspects)),
        "slowNodes": sorted(set(slow_nodes)),
    }


class ClusterDetector:
    """Latest node result per node for one job; :meth:`round` merges those that changed."""

    def __init__(self, job_id: str, cluster_ip: str = "clusterd") -> None:
        self.job_id = job_id
        self.cluster_ip = cluster_ip
        self.reports: dict[str, dict] = {}
        self._changed: set[str] = set()
        self.rounds = 0

    def add_report(self, node: str, result: dict) -> None:
        """The newest node result of ``node`` (a §4.6 result dict)."""
        self.reports[node] = result
        self._changed.add(node)

    def forget(self, node: str) -> None:
        """Drop a node's results (it no longer hosts ranks of the job)."""
        self.reports.pop(node, None)
        self._changed.discard(node)

    def round(self) -> dict | None:
        """Merge the results that changed since the last round; None when none did (§5 step 2)."""
        if not self._changed:
            return None
        changed = [self.reports[n] for n in sorted(self._changed) if n in self.reports]
        self._changed.clear()
        self.rounds += 1
        return merge_cluster(self.job_id, self.cluster_ip, changed, list(self.reports.values()))

    def all_baseline_ready(self, nodes: list[str]) -> bool:
        """Every node in ``nodes`` reported ``baselineReady``."""
        return bool(nodes) and all(self.reports.get(n, {}).get("baselineReady") for n in nodes)


@dataclass
class Action:
    """One thing the host must do: ``kind`` in heavy_on | heavy_off | confirm | report | recover."""

    kind: str
    ranks: list[int] = field(default_factory=list)


class DegradationTracker:
    """Confirmation state machine of §6 for one job (pure; the host performs the actions).

    State: ``heavy`` (communication profiling on) with ``heavy_reason`` (initial | slow | suspect),
    ``degraded``, ``slow_rounds`` (consecutive slow rounds), ``reported_ranks``. Call
    :meth:`on_round` with each cluster result; it returns the actions in order.

    As the reference: the first slow round switches communication profiling on; after
    ``nConsecSlowRoundsToConfirm`` consecutive slow rounds the degradation is confirmed and
    communication profiling goes off again; a round that is not slow resets the count.
    faultmesh differences (named on purpose):

    - *majority ranks*: the reported slow ranks are those localized in more than half of the
      confirming rounds that localized anything (the reference reported the last round's ranks, so
      one noisy round could name a wrong rank); without a majority the report is deferred (and
      communication profiling kept on) until the rounds agree;
    - *recovery hysteresis*: a confirmed degradation recovers only after as many consecutive clean
      rounds (neither slow nor suspect) as it took to confirm (the reference recovered on the first
      clean round, so a straggler flapped between fault and recovery);
    - *initial phase bounded*: communication profiling of the initial phase goes off once every node
      has its baselines, or after ``initial_max_rounds`` rounds (a node that never gets TP data);
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
        self.heavy_reason = "initial"
        self.degraded = False
        self.slow_rounds = 0
        self.clean_rounds = 0
        self.history: deque[list[int]] = deque(maxlen=conf.n_confirm_rounds)
        self.reported_ranks: list[int] = []
        self.deferred = False
        self.suspect_max_rounds = suspect_max_rounds
        self.suspect_cooldown_rounds = suspect_cooldown_rounds
        self._suspect_rounds = 0
        self._cooldown = 0

    def _heavy(self, on: bool, reason: str, out: list[Action]) -> None:
        if on and not self.heavy:
            out.append(Action("heavy_on"))
        elif not on and self.heavy:
            out.append(Action("heavy_off"))
        self.heavy = on
        self.heavy_reason = reason if on else ""

    def majority_ranks(self) -> list[int]:
        """Ranks localized in more than half of the recent slow rounds that localized any rank."""
        localized = [set(r) for r in self.history if r]
        if not localized:
            return []
        counts: dict[int, int] = {}
        for s in localized:
            for r in s:
                counts[r] = counts.get(r, 0) + 1
        return sorted(r for r, c in counts.items() if 2 * c > len(localized))

    def on_round(self, result: dict, baseline_ready: bool = True) -> list[Action]:
        """Process one cluster result (:func:`merge_cluster`); ``baseline_ready``: every node reported it."""
        out: list[Action] = []
        if self._cooldown:
            self._cooldown -= 1
        slow = result.get("isSlow") == 1
        suspects = result.get("suspectRanks") or []
        ranks = list(result.get("slowCalculateRanks") or [])
        if self.degraded:
            if slow or suspects:
                self.clean_rounds = 0
                if slow:
                    self.history.append(ranks)
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
                out.append(Action("recover", self.reported_ranks))
                self.reported_ranks = []
                self._heavy(False, "", out)
            return out
        if not slow:
            self.slow_rounds = 0
            self.history.clear()
            if self.heavy:
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
        self.history.append(ranks)
        if not self.heavy:
            self._heavy(True, "slow", out)
            if self.slow_rounds < self.conf.n_confirm_rounds:
                return out
        self.heavy_reason = "slow"
        if self.slow_rounds >= self.conf.n_confirm_rounds:
            self.degraded = True
            self.clean_rounds = 0
            maj = self.majority_ranks()
            out.append(Action("confirm", maj))
            if maj:
                self.reported_ranks = maj
                out.append(Action("report", maj))
                self._heavy(False, "", out)
            else:
                self.deferred = True  # keep communication profiling on until the ranks agree
        return out
