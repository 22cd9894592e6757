"""The sequential test (issue 34) on a host whose ranks share CPU cores names no healthy rank.

The real-torch stall test (tests/e2e/test_slownode_torch.py: 4 ranks on 2 cores, rank 2 stalled on
node-b) once confirmed rank 1 of node-a beside a second test suite: rank 1 is not rank 2's TP
peer and waits for it only at the global all-reduce, which no TP gap holds -- its own compute
between its TP collectives was slower than its peer's for a few steps, as a core shared with
another tenant makes it. Modelled here: a TP pair with the real job's per-op gap spread (7 TP
collectives a step; per-op spread of the log gap excess 0.20-0.58 on the 2-core box) in which the
healthy rank 1 computes 2.5 x its peer's for 9 steps; the same pair on a cluster (per-op spread
2 %, bench/trainsim_tp.py) with a +20 % card from step 30 is still confirmed within 10 steps.
"""

from __future__ import annotations

import numpy as np
from slownode_realistic import FAULTMESH

from fdol.slownode.featconf import parse_featconf
from fdol.slownode.metrics import StepMetrics
from fdol.slownode.node import NodeDetector
from fdol.slownode.reader import Group

OPS = 7  # TP collectives a step whose gap is judged, as in the real example job
TP = {"tp": Group("tp", "tp", (0, 1))}
WAITS = (1_000_000,) * OPS  # per-op TP waits (the gap rule judges the gaps where they are recorded)


def _rounds(noise: float, slow: dict[int, tuple[range, float]], steps: int, seed: int) -> list[dict]:
    """A node hosting one TP pair (ranks 0, 1); per-op log gap noise ``noise`` per rank;
    ``slow``: rank -> (its steps, log excess of every gap in them). Rounds every 3 steps (the real
    test's 0.5 s rounds of ~155 ms steps) -> the node results."""
    rng = np.random.default_rng(seed)
    nd = NodeDetector(parse_featconf(FAULTMESH), [0, 1], "node-a")
    nd.set_rank_groups({0: TP, 1: TP})
    out = []
    for s in range(steps):
        for r in (0, 1):
            span, extra = slow.get(r, (range(0), 0.0))
            log_gap = np.log(14e6) + rng.normal(0, noise, OPS) + (extra if s in span else 0.0)
            gaps = tuple(int(g) for g in np.exp(log_gap))
            nd.add(StepMetrics(r, s, 0, 0, step_time=int(sum(gaps) * 1.3), tp_gaps=gaps, tp_ops=WAITS))
        if s % 3 == 2:
            out.append(nd.round() or {})
    return out


def test_a_healthy_rank_slowed_for_a_few_steps_by_a_shared_core_is_not_named():
    for noise in (0.14, 0.25):  # per-op spread of the excess ~0.2 and ~0.35 (x sqrt 2)
        for seed in range(4):
            res = _rounds(noise, {1: (range(60, 69), 0.9)}, 120, seed)
            assert not [r["seqRanks"] for r in res if r.get("seqRanks")], (noise, seed)


def test_a_card_20_percent_slower_on_a_cluster_still_passes_within_ten_steps():
    for seed in range(4):
        res = _rounds(0.02, {1: (range(30, 10_000), np.log(1.2))}, 60, seed)
        first = next(i for i, r in enumerate(res) if r.get("seqRanks"))
        assert 30 <= 3 * first + 2 < 40 and res[first]["seqRanks"] == [1], seed
        assert all(r.get("seqRanks") in (None, [], [1]) for r in res)
