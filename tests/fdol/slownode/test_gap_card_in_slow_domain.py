"""A slow card inside a TP domain whose collectives got slower too (a loaded box) is still named.

Measured (issue 36): on the 2-core box a fresh-clone run of the real-torch +20 % test held rank 1 at
x1.5 its TP peer's compute for 412 steps with a gap score of 1.5-8.7 (>= 1 flags), and clusterd never
named it: once the box's load rose, the pair's collectives themselves took 30 % longer than in their
baseline steps, both members' TP time rose, the node called the pair a slow TP domain and dropped the
card from ``slowCalculateRanks``; the job's only TP group being a slow domain, the cluster took it for a
cluster-wide slowdown and named nobody. Modelled here: two ranks of one TP group, 7 TP collectives per
step, rank 1 computes x1.5 from step 30, from step 120 every collective takes x1.6 and every compute
x1.3 (the box's load)."""

from __future__ import annotations

import numpy as np

from fdol.slownode.cluster import ClusterDetector
from fdol.slownode.featconf import parse_featconf
from fdol.slownode.metrics import StepMetrics
from fdol.slownode.node import NodeDetector
from fdol.slownode.reader import Group

CONF = parse_featconf(  # the real-torch test's FeatConf (documented defaults)
    {"jobName": "j", "normalNumber": 20, "nSigma": 3, "degradationPercentage": 0.3,
     "nConsecAnomaliesSignifySlow": 3, "nSecondsDoOneDetection": 0.5, "clusterMeanDistance": 1.3,
     "cardOneNode": 16, "SlowNode": 1}
)  # fmt: skip
GROUPS = {"tp_1": Group("tp_1", "tp", (0, 1))}
OPS = 7


def _rounds(card: float, load_at: int = 120, steps: int = 400, seed: int = 3) -> list[tuple[int, dict]]:
    """Node results every 5 steps -> [(last step, result)]."""
    n = NodeDetector(CONF, [0, 1], "10.0.0.1")
    n.set_rank_groups({0: GROUPS, 1: GROUPS})
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        loaded = s >= load_at
        coll = 0.3e6 * (1.6 if loaded else 1.0)  # the collective's own time (the last arriver's wait)
        gaps = {
            r: 2e6 * np.exp(rng.normal(0, 0.08, OPS)) * (card if r == 1 and s >= 30 else 1.0) * (1.3 if loaded else 1.0)
            for r in (0, 1)
        }  # fmt: skip
        late = np.maximum(gaps[0], gaps[1])
        for r in (0, 1):
            waits = tuple(int(w) for w in coll + late - gaps[r])
            g = tuple(int(x) for x in gaps[r])
            zp = sum(waits)
            n.add(StepMetrics(r, s, 0, 0, step_time=sum(g) + zp, zp_device=zp, zp_host=zp, compute=sum(g),
                              tp_ops=waits, tp_gaps=g))  # fmt: skip
        if s % 5 == 4 and (res := n.round()) is not None:
            out.append((s, res))
    return out


def test_the_card_stays_named_when_its_domain_slows_with_the_box():
    rounds = _rounds(1.5)
    loaded = [res for s, res in rounds if s >= 160]
    assert loaded and all(res["slowCalculateRanks"] == [1] for res in loaded), [
        (res["slowCalculateRanks"], res["slowCommunicationDomains"]) for res in loaded[:5]
    ]
    # and the cluster names it: the slow domain (the job's only TP group) is the cluster's own slowdown
    cd = ClusterDetector.for_conf(CONF)
    cd.add_report("10.0.0.1", loaded[-1])
    assert cd.round()["slowCalculateRanks"] == [1]


def test_a_healthy_pair_on_the_same_box_names_no_card():
    assert not [s for s, res in _rounds(1.0) if res["slowCalculateRanks"]]
