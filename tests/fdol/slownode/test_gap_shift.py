"""The gap rule's level shift (issue 34, :mod:`fdol.slownode.shift`): a card that slows by 5 % is
named although its excess over its TP peers stays under ``computeExcess`` (it was innately faster),
while a healthy card innately 3.5 % slower than its peers is not; a slowed card stays named however
long it stays slow; a member whose partner recovers is not named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fdol.slownode.featconf import FeatConfError, parse_featconf
from fdol.slownode.metrics import StepMetrics
from fdol.slownode.peers import GapDetector

OPS = 12  # per-op TP collectives of a step (bench/trainsim_tp.py: 4 micro-batches x 3 gaps)
NOISE = 0.02  # per-op compute noise of a cluster card (bench/trainsim_tp.py SimConf.op_noise)


def _run(
    speeds: list[float],
    slow: dict[int, tuple[int, int, float]],
    steps: int,
    shift: float = 0.03,
    seed: int = 0,
) -> list[tuple[int, list[int]]]:
    """One TP group of ``len(speeds)`` ranks, rank r computing ``speeds[r]`` x the nominal gap;
    ``slow``: rank -> (first step, last step + 1, factor). Rounds every 5 steps -> [(last step,
    flagged ranks)]."""
    rng = np.random.default_rng(seed)
    det = GapDetector(window=40, shift=shift)
    n = len(speeds)
    hist: dict[int, list[StepMetrics]] = {r: [] for r in range(n)}
    out = []
    for s in range(steps):
        for r in range(n):
            a, b, f = slow.get(r, (0, 0, 1.0))
            log_gap = np.log(3.5e6 * speeds[r] * (f if a <= s < b else 1.0)) + rng.normal(0, NOISE, OPS)
            gaps = tuple(int(g) for g in np.exp(log_gap))
            hist[r].append(StepMetrics(r, s, 0, 0, step_time=int(sum(gaps) * 1.2), tp_gaps=gaps))
        if s % 5 == 4:
            out.append((s, det.evaluate([list(range(n))], hist)[0]))
    return out


# rank 1 is innately 3.5 % slower than the others (under the 0.05 floor, above the shift floor),
# rank 2 innately 2 % faster and slows by 5 % from step 60: it ends 3 % above its peers
SPEEDS = [1.0, 1.035, 0.98, 1.0]


@pytest.mark.parametrize("seed", range(3))
def test_a_card_slowed_5_percent_is_named_and_the_innately_slower_healthy_one_is_not(seed):
    rounds = _run(SPEEDS, {2: (60, 10**9, 1.05)}, 200, seed=seed)
    assert not [s for s, f in rounds if f and f != [2]], rounds
    named = [s for s, f in rounds if f == [2]]
    assert named and min(named) <= 74  # within 3 rounds of the onset
    assert all(f == [2] for s, f in rounds if s >= 74)  # and from then on: its base is held


def test_without_the_shift_rule_the_slowed_card_is_not_named():
    assert not [s for s, f in _run(SPEEDS, {2: (60, 10**9, 1.05)}, 200, shift=0.0) if f]


def test_a_card_that_recovers_is_released():
    rounds = _run(SPEEDS, {2: (60, 120, 1.05)}, 220)
    assert [s for s, f in rounds if f == [2] and 74 <= s < 120]
    assert not [s for s, f in rounds if f and s >= 135]


@pytest.mark.parametrize("n", [2, 3])
def test_the_peers_of_a_recovering_card_are_not_named(n):
    """Rank 0 runs +20 % until step 100: when it recovers its peers' excess rises (by 0.18 with
    two members, 0.09 with three), but theirs is no rise of their own."""
    rounds = _run([1.0] * n, {0: (0, 100, 1.2)}, 220)
    assert [s for s, f in rounds if f == [0] and s < 100]
    assert not [s for s, f in rounds if set(f) - {0}], rounds


def test_computeshift_is_a_featconf_key():
    assert parse_featconf({"jobName": "j"}).compute_shift == 0.03
    conf = parse_featconf({"jobName": "j", "computeShift": 0})
    assert conf.compute_shift == 0 and conf.to_json()["computeShift"] == 0
    with pytest.raises(FeatConfError, match="computeShift"):
        parse_featconf({"jobName": "j", "computeShift": -0.1})
    assert math.isclose(parse_featconf({"jobName": "j", "COMPUTESHIFT": 0.04}).compute_shift, 0.04)
