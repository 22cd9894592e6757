"""Offline replay of a recorded job through the node and cluster levels (benches, analysis).

:func:`replay` reads every rank of ``<job dir>`` once (the file reader is the only I/O), turns the
records into per-step metrics, then runs detection rounds every ``steps_per_round`` steps of the
slowest rank: one :class:`NodeDetector` per node, the cluster merge and the confirmation state
machine. Communication records are whatever the job wrote (no switch is simulated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cluster import ClusterDetector, DegradationTracker
from .featconf import FeatConf
from .metrics import StepAssembler, StepMetrics
from .node import NodeDetector
from .reader import JobReader


@dataclass
class RoundLog:
    """One replayed round: the step reached, node results, cluster result and tracker actions."""

    step: int
    nodes: dict[str, dict] = field(default_factory=dict)
    cluster: dict | None = None
    actions: list[tuple[str, list[int]]] = field(default_factory=list)


def load_steps(
    job_dir: str | Path, ranks: list[int], traffic: int = 0
) -> tuple[dict[int, list[StepMetrics]], dict]:
    """All steps per rank of a recorded job, and the bad-input counters."""
    jr = JobReader(job_dir, ranks, max_read_bytes=1 << 30)
    recs = jr.poll()
    out = {}
    for r in ranks:
        a = StepAssembler(r, lambda r=r: jr.groups(r), traffic=traffic, bad=jr.bad)
        out[r] = a.feed(recs.get(r, [])) + a.flush()
    return out, dict(jr.bad)


def replay(
    job_dir: str | Path, placement: dict[str, list[int]], conf: FeatConf, steps_per_round: int
) -> list[RoundLog]:
    """Replay a recorded job (see module doc). ``placement``: node -> its global ranks."""
    ranks = sorted(r for rs in placement.values() for r in rs)
    steps, _ = load_steps(job_dir, ranks, conf.traffic)
    jr = JobReader(job_dir, ranks)
    jr.poll()
    nodes = {}
    for node, rs in placement.items():
        nd = NodeDetector(conf, rs, node)
        nd.set_rank_groups({r: g for r in rs if (g := jr.groups(r))})
        nodes[node] = nd
    cluster = ClusterDetector.for_conf(conf)
    tracker = DegradationTracker(conf)
    last = min((s[-1].step for s in steps.values() if s), default=-1)
    first = min((s[0].step for s in steps.values() if s), default=0)
    logs = []
    idx = {r: 0 for r in ranks}
    for upto in range(first + steps_per_round - 1, last + 1, steps_per_round):
        log = RoundLog(upto)
        for node, nd in nodes.items():
            for r in nd.ranks:
                s = steps.get(r, [])
                while idx[r] < len(s) and s[idx[r]].step <= upto:
                    nd.add(s[idx[r]])
                    idx[r] += 1
            res = nd.round()
            if res is not None:
                log.nodes[node] = res
                cluster.add_report(node, res)
        log.cluster = cluster.round()
        if log.cluster is not None:
            ready = cluster.all_baseline_ready(list(nodes))
            log.actions = [(a.kind, a.ranks) for a in tracker.on_round(log.cluster, ready)]
        logs.append(log)
    return logs
