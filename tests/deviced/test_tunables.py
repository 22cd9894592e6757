"""deviced's once-fixed values are flags with the old value as default (issue 20): the recover
delay (1 s), the polling fallback (5 min), the HBM/AIC pairing window (±5 s), codes per chip (512)
and the hot-reset budget (3 per 6 h)."""

from __future__ import annotations

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend

BASE = ["--node-name", "n", "--backend", "sim", "--clusterd", "127.0.0.1:1"]


def test_defaults_are_the_old_values():
    args = build_parser().parse_args(BASE)
    eng = DeviceD(args, SimBackend(1, 1)).engine
    assert (eng.recover_delay_ms, eng.poll_fallback_ms, eng.hbm_pair_window_ms, eng.max_codes) == (
        1000,
        300_000,
        5000,
        512,
    )
    assert (args.hot_reset_budget, args.hot_reset_window_s) == (3, 21600.0)


def test_flags_reach_the_engine():
    argv = [*BASE, "--recover-delay-s", "0.2", "--poll-fallback-s", "60", "--hbm-pair-window-s", "2"]
    eng = DeviceD(build_parser().parse_args([*argv, "--max-codes-per-chip", "64"]), SimBackend(1, 1)).engine
    assert (eng.recover_delay_ms, eng.poll_fallback_ms, eng.hbm_pair_window_ms, eng.max_codes) == (
        200,
        60_000,
        2000,
        64,
    )
