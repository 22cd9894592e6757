"""Cluster-level slow-node detection and confirmation (reference fdol.md §5–6).

:func:`merge_cluster` merges the node results that changed since the last round (§5 steps 3–8);
:func:`pp_link_analysis` is the PP link rule (§5 step 6). :class:`ClusterDetector` keeps the latest
node result per node and runs rounds. :class:`~fdol.slownode.degradation.DegradationTracker`
(re-exported here) is the confirmation state machine of §6 (first slow round switches communication
profiling on; confirmation after ``nConsecSlowRoundsToConfirm`` consecutive slow rounds; recovery
when a round is not slow).

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
- *cluster-wide slowdowns name nobody* (rules ``faultmesh``): when more than half of the job's TP
  groups are slow domains, of its PP senders slow senders, of its nodes slow hosts or of its ranks
  slow IO ranks, the slowdown is the cluster's (network congestion, a storage slowdown), not an
  entity's, and that list is emptied (the reference named every PP pair and every rank);
  a slow TP domain or slow host is kept only when its TP wait (launch) rose ``margin`` (the
  ``degradationPercentage``) more than the median of the other ranks' (node reports' ``rise``):
  a load swing of a shared box raises every rank's. With two nodes also ``nSigma`` times the
  ranks' relative baseline spread of that time (``zpSpread`` / ``hostSpread``), as the whole-node
  rule below: when a shared box's load changes one "node"'s collectives slow first.
- *a whole node slower* (rules ``faultmesh``): a node whose forward time rose ``nodeRise`` over its
  own baseline and over the median of the other nodes' rises, not explained by a slow card, TP
  domain or host of its own, has all its ranks added to ``slowCalculateRanks`` (``slowNodeRanks``).
  With two nodes the other one is the only baseline, so the rise (own and over the other's) must
  also reach ``nSigma`` times the larger of the two nodes' forward noise (``forwardSpread``: the
  relative spread of a rank's forward over its baseline steps, the largest over the node's
  ranks): on a real pair of nodes (spread ~1 %) a +20 % node stands out within the confirming
  rounds; two "nodes" sharing a 2-core box swing by +-25 % in turn with a ~10 % spread and are
  not named (their swings look like a slower node and are not one).
"""

from __future__ import annotations

from .degradation import Action, DegradationTracker
from .featconf import FeatConf
from .results import fmt_level

__all__ = [
    "Action",
    "ClusterDetector",
    "DegradationTracker",
    "merge_cluster",
    "merge_groups_json",
    "pp_link_analysis",
]


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


def _over_half(named: int, total: int) -> bool:
    return total > 0 and 2 * named > total


def _covered(tp_groups: list[list[int]], domains: list[list[int]]) -> int:
    """How many TP groups are wholly inside the node-reported slow domains."""
    inside = {r for d in domains for r in d}
    return sum(1 for g in tp_groups if g and all(r in inside for r in g))


def _slow_node_ranks(
    changed: list[dict], all_reports: list[dict], rise: float, n_sigma: float = 3.0
) -> list[int]:
    """Ranks of the nodes that compute uniformly slower than the others (module doc)."""
    rises = {id(r): r["forwardRise"] for r in all_reports if r.get("forwardRise")}
    out: list[int] = []
    if len(rises) < 2:
        return out
    spreads = {id(r): r.get("forwardSpread") for r in all_reports if r.get("forwardRise")}
    for res in changed:
        x = res.get("forwardRise")
        if not x or res.get("explained") or x < 1 + rise:
            continue
        need = 1 + rise
        if len(rises) == 2:  # the other node is the only baseline: the rise must stand out of
            sp = list(spreads.values())  # both nodes' own step-to-step forward noise
            if not all(isinstance(v, int | float) for v in sp):
                continue
            need = 1 + max(rise, n_sigma * max(sp))
            if x < need:
                continue
        others = [v for k, v in rises.items() if k != id(res)]
        if others and x / sorted(others)[len(others) // 2] >= need:
            out.extend(res.get("ranks") or [])
    return out


def _rises(reports: list[dict], key: str) -> tuple[dict[int, float], float | None]:
    """({rank: rise} of ``key`` (``zp`` | ``host``) from the node reports' ``rise``, the largest
    relative baseline spread ``<key>Spread`` over those ranks; None when a rank lacks one)."""
    out: dict[int, float] = {}
    spread: float | None = 0.0
    for rep in reports:
        for r, v in (rep.get("rise") or {}).items():
            x = v.get(key) if isinstance(v, dict) else None
            if isinstance(x, int | float) and x > 0 and str(r).isdigit():
                out[int(r)] = float(x)
                sp = v.get(key + "Spread")
                spread = (
                    max(spread, float(sp)) if isinstance(sp, int | float) and spread is not None else None
                )
    return out, spread


def _stands_out(ranks: list[int], rises: dict[int, float], margin: float) -> bool:
    """``ranks`` all rose ``margin`` more than the median of the other ranks' rises (True when no
    other rank has one to compare with: the own-history rule stands alone)."""
    others = sorted(v for r, v in rises.items() if r not in ranks)
    mine = [rises[r] for r in ranks if r in rises]
    if not others or not mine:
        return True
    return min(mine) >= (1 + margin) * others[len(others) // 2]


def _margin(reports: list[dict], spread: float | None, margin: float, n_sigma: float) -> float | None:
    """The margin a slow TP domain or host must rise over the other ranks: ``margin``, and with two
    nodes (the other node is the only baseline) at least ``n_sigma`` baseline spreads, as the
    whole-node rule; None (keep nothing) when two nodes' spread is unknown."""
    if len(reports) != 2:
        return margin
    return None if spread is None else max(margin, n_sigma * spread)


def merge_cluster(
    job_id: str,
    cluster_ip: str,
    changed: list[dict],
    all_reports: list[dict],
    rules: str = "faultmesh",
    node_rise: float = 0.08,
    margin: float = 0.3,
    groups: tuple[list[list[int]], list[list[int]]] | None = None,
    n_sigma: float = 3.0,
) -> dict:
    """Merge changed node results into the cluster result (§5). Keys as the reference plus
    ``suspectRanks``, ``seqRanks`` (slow ranks whose sequential evidence passed the bound,
    :mod:`.sequential`), ``slowNodes`` (nodes whose result was slow), ``slowNodeRanks`` and
    ``suppressed`` (lists emptied as cluster-wide, rules ``faultmesh``). ``groups``: the TP and PP
    groups of ``all_reports`` when the caller has them (:func:`merge_groups_json` otherwise);
    ``n_sigma``: the whole-node rule's margin over the nodes' forward noise with two nodes."""
    tp_groups, pp_groups = groups if groups is not None else merge_groups_json(all_reports)
    calc: list[int] = []
    io: list[int] = []
    hosts: list[str] = []
    domains: list[list[int]] = []
    sends: list[int] = []
    suspects: list[int] = []
    seq: set[int] = set()
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
        seq.update(res.get("seqRanks") or ())
        io.extend(res.get("slowIORanks") or [])
        hosts.extend(res.get("slowHostNodes") or [])
        domains.extend(res.get("slowCommunicationDomains") or [])
        sends.extend(res.get("slowSendRanks") or [])
        level = max(level, _level(res.get("degradationLevel", "0.0%")))
    suppressed = []
    node_ranks: list[int] = []
    if rules == "faultmesh":
        if domains:
            zp, sp = _rises(all_reports, "zp")
            need = _margin(all_reports, sp, margin, n_sigma)
            domains = [d for d in domains if need is not None and _stands_out(list(d), zp, need)]
        if hosts:
            hr, sp = _rises(all_reports, "host")
            need = _margin(all_reports, sp, margin, n_sigma)
            node_of = {n.get("nodeRank"): n.get("ranks") or [] for n in all_reports}
            hosts = [h for h in hosts if need is not None and _stands_out(list(node_of.get(h, [])), hr, need)]
        n_ranks = sum(len(r.get("ranks") or ()) for r in all_reports)
        n_senders = sum(len(g) - 1 for g in pp_groups)
        for key, named, total in (
            ("slowCommunicationDomains", _covered(tp_groups, domains), len(tp_groups)),
            ("slowSendRanks", len(set(sends)), n_senders),
            ("slowHostNodes", len(set(hosts)), len(all_reports)),
            ("slowIORanks", len(set(io)), n_ranks),
            ("slowCalculateRanks", len(set(calc)), n_ranks),
        ):
            if _over_half(named, total):
                suppressed.append(key)
        domains = [] if "slowCommunicationDomains" in suppressed else domains
        sends = [] if "slowSendRanks" in suppressed else sends
        hosts = [] if "slowHostNodes" in suppressed else hosts
        io = [] if "slowIORanks" in suppressed else io
        calc = [] if "slowCalculateRanks" in suppressed else calc
        node_ranks = _slow_node_ranks(changed, all_reports, node_rise, n_sigma)
        calc = calc + node_ranks
        slow = bool(calc or domains or sends or hosts or io)
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
        "seqRanks": sorted(seq.intersection(calc)),
        "slowNodes": sorted(set(slow_nodes)),
        "slowNodeRanks": sorted(set(node_ranks)),
        "suppressed": suppressed,
    }


class ClusterDetector:
    """Latest node result per node for one job; :meth:`round` merges those that changed."""

    def __init__(
        self,
        job_id: str,
        cluster_ip: str = "clusterd",
        rules: str = "faultmesh",
        node_rise: float = 0.08,
        margin: float = 0.3,
        n_sigma: float = 3.0,
    ) -> None:
        self.margin = margin
        self.n_sigma = n_sigma
        self.job_id = job_id
        self.cluster_ip = cluster_ip
        self.rules = rules
        self.node_rise = node_rise
        self.reports: dict[str, dict] = {}
        self._changed: set[str] = set()
        self.rounds = 0
        self._pg: dict[str, object] = {}  # node -> the parallelGroups of its latest report
        self._groups: tuple[list[list[int]], list[list[int]]] | None = None  # merged, while they stay

    @classmethod
    def for_conf(cls, conf: FeatConf, cluster_ip: str = "clusterd") -> ClusterDetector:
        """A detector with the job's rules, ``nodeRise``, margin (``degradationPercentage``, 0.3
        when 0) and ``nSigma`` (3 when 0)."""
        return cls(
            conf.job_id,
            cluster_ip,
            conf.rules,
            conf.node_rise,
            conf.degradation_percentage or 0.3,
            conf.n_sigma or 3.0,
        )

    def add_report(self, node: str, result: dict) -> None:
        """The newest node result of ``node`` (a §4.6 result dict)."""
        self.reports[node] = result
        self._changed.add(node)
        pg = result.get("parallelGroups")
        if node not in self._pg or self._pg[node] != pg:
            self._pg[node] = pg
            self._groups = None

    def forget(self, node: str) -> None:
        """Drop a node's results (it no longer hosts ranks of the job)."""
        self.reports.pop(node, None)
        self._changed.discard(node)
        self._pg.pop(node, None)
        self._groups = None

    def round(self) -> dict | None:
        """Merge the results that changed since the last round; None when none did (§5 step 2)."""
        if not self._changed:
            return None
        changed = [self.reports[n] for n in sorted(self._changed) if n in self.reports]
        self._changed.clear()
        self.rounds += 1
        reports = list(self.reports.values())
        if self._groups is None:
            self._groups = merge_groups_json(reports)
        return merge_cluster(
            self.job_id,
            self.cluster_ip,
            changed,
            reports,
            self.rules,
            self.node_rise,
            self.margin,
            self._groups,
            self.n_sigma,
        )

    def all_baseline_ready(self, nodes: list[str]) -> bool:
        """Every node in ``nodes`` reported ``baselineReady``."""
        return bool(nodes) and all(self.reports.get(n, {}).get("baselineReady") for n in nodes)
