"""Window arithmetic with hand-computed values (reference fdol.md §8.6)."""

from __future__ import annotations

import math

import pytest

from fdol.slownet.window import PathWindow, PingRow, row_problem

P = 10_000  # period, ms


def row(k, loss=0.0, delay=5.0, dst="200", ts_off=1):
    return PingRow(0, "0", "100", "0", dst, delay, delay, delay, loss, k * P + ts_off)


def fill(w, losses, delays=None, dst="200"):
    """Periods 0..len-1 with the given loss fractions / delays."""
    delays = delays or [5.0] * len(losses)
    w.add([row(k, loss, d, dst) for k, (loss, d) in enumerate(zip(losses, delays, strict=True))])


def test_quiet_link_flags_three_percent_loss():
    # baseline 8 x 0 % -> mean 0, std 0 -> threshold 0 + 3 * max(0, 1) = 3 %
    w = PathWindow(P)
    fill(w, [0.0] * 8 + [0.03])
    r = w.evaluate(8)
    assert r.loss_thr[0] == pytest.approx(3.0)
    assert bool(r.loss_fault[0])
    w2 = PathWindow(P)
    fill(w2, [0.0] * 8 + [0.029])
    assert not bool(w2.evaluate(8).loss_fault[0])


def test_threshold_mean_plus_three_std_hand_computed():
    # baseline loss % = [0,0,0,0,0,0,0,10]: mean 1.25; popvar = 100/8 - 1.25^2 = 10.9375
    # threshold = 1.25 + 3 * sqrt(10.9375) = 1.25 + 9.92157 = 11.17157
    w = PathWindow(P, loss_abs_pct=None)
    fill(w, [0.0] * 7 + [0.10] + [0.112])
    r = w.evaluate(8)
    assert r.loss_thr[0] == pytest.approx(1.25 + 3 * math.sqrt(10.9375))
    assert r.loss[0] == pytest.approx(11.2)
    assert bool(r.loss_fault[0])
    w2 = PathWindow(P, loss_abs_pct=None)
    fill(w2, [0.0] * 7 + [0.10] + [0.111])
    assert not bool(w2.evaluate(8).loss_fault[0])


def test_delay_threshold_and_std_floor():
    # delays [10,12]*4: mean 11, std 1 -> threshold 14
    w = PathWindow(P)
    fill(w, [0.0] * 9, [10.0, 12.0] * 4 + [14.0])
    r = w.evaluate(8)
    assert r.delay_thr[0] == pytest.approx(14.0) and bool(r.delay_fault[0]) and not bool(r.loss_fault[0])
    # constant 5 -> std 0, floored to 1 -> threshold 8; 7.9 is fine
    w2 = PathWindow(P)
    fill(w2, [0.0] * 9, [5.0] * 8 + [7.9])
    r2 = w2.evaluate(8)
    assert r2.delay_thr[0] == pytest.approx(8.0) and not bool(r2.delay_fault[0])


def test_rows_of_one_period_are_averaged_and_failed_delay_is_no_sample():
    w = PathWindow(P)
    w.add([row(0, 0.0, 4.0), row(0, 0.1, 6.0, ts_off=5000), row(0, 1.0, -1.0, ts_off=9000)])
    r = w.evaluate(0)
    assert r.loss[0] == pytest.approx((0 + 10 + 100) / 3)
    assert r.delay[0] == pytest.approx(5.0)  # the -1 row is not a delay sample


def test_baseline_uses_only_the_eight_older_periods():
    # a 50 % period 9 periods back is outside the baseline of period 9 (periods 1..8)
    w = PathWindow(P, loss_abs_pct=None)
    fill(w, [0.5] + [0.0] * 8 + [0.03])
    r = w.evaluate(9)
    assert r.loss_thr[0] == pytest.approx(3.0) and bool(r.loss_fault[0])


def test_no_relative_verdict_without_enough_baseline_but_absolute_bound_applies():
    w = PathWindow(P, min_baseline=3)
    fill(w, [0.0, 0.0, 0.15])
    r = w.evaluate(2)
    assert math.isinf(r.delay_thr[0])
    assert r.loss_thr[0] == pytest.approx(20.0) and not bool(r.loss_fault[0])  # 15 % < abs 20 %
    w.add([row(3, 0.25)])
    assert bool(w.evaluate(3).loss_fault[0])  # 25 % >= 20 % with no baseline


def test_persistent_fault_is_not_absorbed_and_recovers():
    w = PathWindow(P, loss_abs_pct=None)
    losses = [0.0] * 8 + [0.10] * 12 + [0.0] * 2
    verdicts = []
    for k, loss in enumerate(losses):  # one period at a time, as clusterd runs it
        w.add([row(k, loss)])
        verdicts.append(bool(w.evaluate(k).loss_fault[0]) if k >= 8 else None)
    assert verdicts[8:20] == [True] * 12  # still faulty after the window is full of faulty periods
    assert verdicts[20:] == [False, False]


def test_evaluate_is_idempotent_and_missing_period_is_empty():
    w = PathWindow(P)
    fill(w, [0.0] * 8 + [0.05])
    a, b = w.evaluate(8), w.evaluate(8)
    assert list(a.loss_fault) == list(b.loss_fault) == [True]
    assert len(w.evaluate(20).idx) == 0


def test_bad_rows_are_counted_and_skipped():
    w = PathWindow(P)
    good = row(100)
    bad = [
        PingRow(0, "0", "100", "0", "200", 1, 1, 1, 1.5, 100 * P),  # loss above 100 %
        PingRow(0, "0", "100", "0", "200", -5, 1, 1, 0.0, 100 * P),  # negative delay
        PingRow(0, "0", "100", "0", "200", 1, 1, 1e12, 0.0, 100 * P),  # absurd delay
        PingRow(0, "0", "100", "0", "", 1, 1, 1, 0.0, 100 * P),  # no address
        PingRow(0, "0", "100", "0", "200", 1, 1, 1, float("nan"), 100 * P),
    ]
    counts = w.add([good, *bad, row(80), row(10_000)], now_ms=100 * P + 5)
    assert counts == {"accepted": 1, "loss_range": 2, "delay_range": 2, "address": 1, "late": 1, "future": 1}
    assert row_problem(good) is None


def test_many_paths_grow_storage():
    w = PathWindow(P)
    w.add([row(0, 0.0, 5.0, dst=str(i)) for i in range(1000)])
    r = w.evaluate(0)
    assert len(r.idx) == 1000 and len(w.keys) == 1000


def test_a_row_of_the_wrong_shape_is_a_clear_error_and_adds_nothing():
    w = PathWindow(P)
    with pytest.raises(ValueError, match="10 fields"):
        w.add([row(0), tuple(row(0))[:9]])
    with pytest.raises(ValueError, match="10 fields"):
        w.add([(*row(0), "extra")])
    assert w.keys == [] and w.add([row(0)]) == {"accepted": 1}
