"""Detector rules with hand-computed values: time detector, split, homogenization, pattern, FeatConf."""

from __future__ import annotations

import math

import pytest

from fdol.slownode.detect import TimeDetector, homogenize, low_split, recursive_low_split, trim_count
from fdol.slownode.featconf import FeatConfError, parse_featconf
from fdol.slownode.metrics import StepMetrics
from fdol.slownode.pattern import PatternDetector, compute_value


def test_trim_count_rules():
    assert trim_count(20, 3) == 3  # 20 >= 12: k = nConsec
    assert trim_count(20, 6) == 3  # 20 < 24: k = 3
    assert trim_count(5, 3) == 2  # clamped so one sample remains (the reference panics)
    assert trim_count(1, 1) == 0


def test_baseline_trim_mean_pop_std_and_exact_welford():
    d = TimeDetector(normal_number=6, n_sigma=2, degradation_percentage=0.3, n_consec=1)
    for x in (10, 12, 11, 13, 9, 100):
        assert d.add(x) is False
    # sorted [9,10,11,12,13,100], trim 1 each end -> [10,11,12,13]
    assert d.ready and d.n == 4 and d.mean == 11.5
    assert d.std == pytest.approx(math.sqrt(1.25))
    assert d.upper() == pytest.approx(14.95)
    assert d.history == type(d.history)()  # baseline samples are not rescanned
    assert d.add(14) is False  # 14 <= 14.95: folded in exactly
    assert d.n == 5 and d.mean == pytest.approx(12.0)
    assert d.std == pytest.approx(math.sqrt(2.0))
    assert d.add(15.7) is True  # > 12*1.3 = 15.6
    assert d.n == 5  # abnormal values are not folded


def test_nsigma_used_when_percentage_is_zero():
    d = TimeDetector(normal_number=4, n_sigma=2, degradation_percentage=0, n_consec=1)
    for x in (10, 12, 10, 12):  # k = 3 clamped to 1: kept [10,12]: mean 11, std 1
        d.add(x)
    assert d.mean == 11 and d.std == 1
    assert d.upper() == 13
    assert d.add(13.5) is True and d.slow
    d0 = TimeDetector(normal_number=4, n_sigma=0, degradation_percentage=0, n_consec=1)
    for x in (10, 12, 10, 12):
        d0.add(x)
    assert d0.upper() == 14  # nSigma 0 -> 3


def test_slow_needs_last_nconsec_abnormal_and_degradation():
    d = TimeDetector(normal_number=12, n_sigma=3, degradation_percentage=0.3, n_consec=3)
    for _ in range(12):
        d.add(100)
    for x in (0, float("inf"), 140, 150):  # invalid values are ignored
        d.add(x)
    assert not d.slow
    d.add(131)
    assert d.slow
    assert d.degradation == pytest.approx((140 + 150 + 131) / 3 / 100 - 1)
    d.add(100)
    assert not d.slow and d.degradation == 0


def test_split_and_recursion_maps_back_to_rank_positions():
    assert low_split([10, 50, 52], 1.3) == [0]
    assert low_split([10, 11], 1.3) is None  # ratio 1.1 <= 1.3
    assert low_split([1, 5, 9], 1.3) == [0]  # first largest gap 4 >= half the range 4
    assert low_split([1, 4, 6, 9], 1.3) is None  # largest gap 3 < half the range 4
    assert low_split([1, 2, 9], 1.3) == [0, 1]
    # [50,5,52,1,51]: first split lower = {5,1} (positions 1,3); then [5,1] -> 1 (position 3)
    assert recursive_low_split([50, 5, 52, 1, 51], 1.3) == [3]
    assert recursive_low_split([10, 10], 1.3) == []


def test_homogenize_requires_identical_sets_over_nconsec_steps():
    steps = [{0: 4.0, 1: 20.0}, {0: 5.0, 1: 21.0}, {0: 4.0, 1: 19.0}]
    assert homogenize(steps, 3, 1.3) == [0]
    assert homogenize(steps[:2], 3, 1.3) == []
    assert homogenize([{0: 4.0, 1: 20.0}, {0: 20.0, 1: 4.0}], 2, 1.3) == []
    assert homogenize([{7: 4.0, 9: 20.0}] * 2, 2, 1.3) == [7]


def _steps(rank, n, compute, zp, start=0):
    return [
        StepMetrics(rank, start + i, 0, 0, step_time=200, zp_device=zp, compute=compute) for i in range(n)
    ]


def test_pattern_detector_flags_and_suspects():
    p = PatternDetector(window=10, compute_ratio=1.10, wait_ratio=3.0)
    hist = {2: _steps(2, 10, 120, 2), 3: _steps(3, 10, 100, 10)}
    res = p.evaluate([[2, 3]], hist)
    assert res.flagged == [2] and res.suspects == []
    assert res.ratios[2] == (1.2, 5.0) and res.ratios[3] == (pytest.approx(0.8333), 0.2)
    # no TP collective samples: compute alone makes a suspect
    hist = {2: _steps(2, 10, 120, 0), 3: _steps(3, 10, 100, 0)}
    res = p.evaluate([[2, 3]], hist)
    assert res.flagged == [] and res.suspects == [2]
    # under the wait threshold (a natural straggler): not flagged, only a suspect
    hist = {2: _steps(2, 10, 112, 4), 3: _steps(3, 10, 100, 10)}
    res = p.evaluate([[2, 3]], hist)
    assert res.flagged == [] and res.suspects == [2]
    # old steps fall out of the window (by step number)
    hist = {2: _steps(2, 10, 120, 2) + _steps(2, 10, 100, 10, start=10), 3: _steps(3, 20, 100, 10)}
    assert p.evaluate([[2, 3]], hist).flagged == []
    # baseline condition: a rank slower from the start (baseline ratio 1.2) is not flagged ...
    hist = {2: _steps(2, 10, 120, 2), 3: _steps(3, 10, 100, 10)}
    assert p.evaluate([[2, 3]], hist, {2: 120.0, 3: 100.0}).flagged == []
    # ... it is when it got slower than its own baseline by more than half the margin (1.2/1.14 > 1.05)
    assert p.evaluate([[2, 3]], hist, {2: 114.0, 3: 100.0}).flagged == [2]
    assert p.evaluate([[2, 3]], hist, {2: 116.0, 3: 100.0}).flagged == []  # 1.2/1.16 < 1.05
    assert p.evaluate([[2, 3]], hist, {3: 100.0}).flagged == []  # no baseline yet
    # fewer than half a window of samples: no verdict
    hist = {2: _steps(2, 4, 120, 2), 3: _steps(3, 4, 100, 10)}
    assert p.evaluate([[2, 3]], hist).ratios == {}


def test_compute_value_fallback():
    assert compute_value(StepMetrics(0, 1, 0, 0, step_time=100, compute=40)) == 40
    assert compute_value(StepMetrics(0, 1, 0, 0, step_time=100, comm_wait=30)) == 70
    assert compute_value(StepMetrics(0, 1, 0, 0, step_time=100)) == 0


def test_featconf_keys_case_insensitive_defaults_and_validation():
    c = parse_featconf({"JOBNAME": "j1", "slownode": 1, "NSIGMA": 2, "degradationpercentage": 0})
    assert c.job_name == "j1" and c.job_id == "j1" and c.job_namespace == "default"
    assert c.n_sigma == 2 and c.degradation_percentage == 0 and c.normal_number == 20
    assert c.n_confirm_rounds == 5 and c.pattern_detector
    doc = {
        "jobName": "default-test-pytorch-2pod-16npu",
        "jobNamespace": "default",
        "normalNumber": 20,
        "nSigma": 3,
        "degradationPercentage": 0.3,
        "nConsecAnomaliesSignifySlow": 3,
        "nSecondsDoOneDetection": 30,
        "clusterMeanDistance": 1.3,
        "cardOneNode": 16,
        "SlowNode": 1,
        "rankIds": [3, 1],
        "servers": [],
        "extra": 1,
    }
    c = parse_featconf(doc)
    assert c.n_seconds == 30.0 and c.rank_ids == (1, 3) and c.unknown_keys == ("extra",)
    assert parse_featconf(c.to_json()) == c
    for bad, msg in [
        ({"jobName": "j", "normalNumber": 0}, "normalNumber"),
        ({"jobName": "j", "nSigma": -1}, "nSigma"),
        ({"jobName": "j", "degradationPercentage": -0.1}, "degradationPercentage"),
        ({"jobName": "j", "nConsecAnomaliesSignifySlow": 0}, "nConsec"),
        ({"jobName": "j", "nSecondsDoOneDetection": 0}, "nSecondsDoOneDetection"),
        ({"jobName": "j", "clusterMeanDistance": 1}, "clusterMeanDistance"),
        ({"jobName": "j", "cardOneNode": 0}, "cardOneNode"),
        ({"jobName": "j", "SlowNode": 2}, "SlowNode"),
        ({"jobName": "j", "normalNumber": "20"}, "number"),
        ({"jobName": "j", "normalNumber": 2.5}, "integer"),
        ({"jobName": "j", "normalNumber": True}, "number"),
        ({"jobName": "j", "slowNode": 1, "SlowNode": 0}, "twice"),
        ({"jobName": "../x"}, "jobId"),
        ({"slowNode": 1}, "jobName"),
        ([1], "object"),
    ]:
        with pytest.raises(FeatConfError, match=msg):
            parse_featconf(bad)
    assert parse_featconf({"slowNode": 0}, job_name="from-file").job_name == "from-file"


def test_switch_parse_and_dicts():
    import orjson

    from fdol.slownode.switch import HEAVY, LIGHT, parse_switch, switch_dict

    assert parse_switch(orjson.dumps(HEAVY)) == (True, True)
    assert parse_switch(orjson.dumps(LIGHT)) == (True, False)
    assert parse_switch(orjson.dumps(switch_dict(False, False))) == (False, False)
    assert parse_switch(
        b'{"CommunicationOperator":"on","Step":"off","SaveCheckpoint":"off","FP":"off","DataLoader":"off"}'
    ) == (True, True)
    assert parse_switch(b"garbage") == (False, False)
    assert parse_switch(b'{"Step":"on"}') == (False, False)
