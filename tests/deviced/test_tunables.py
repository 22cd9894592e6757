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
    assert eng.restart_grace_ms == 10_000  # issue 30's restart grace


def test_flags_reach_the_engine():
    argv = [*BASE, "--recover-delay-s", "0.2", "--poll-fallback-s", "60", "--hbm-pair-window-s", "2"]
    argv += ["--restart-grace-s", "30"]
    eng = DeviceD(build_parser().parse_args([*argv, "--max-codes-per-chip", "64"]), SimBackend(1, 1)).engine
    assert eng.restart_grace_ms == 30_000
    assert (eng.recover_delay_ms, eng.poll_fallback_ms, eng.hbm_pair_window_ms, eng.max_codes) == (
        200,
        60_000,
        2000,
        64,
    )


def test_reconnect_backoff_is_a_flag_as_on_noded():
    """issue 29: ``--clusterd-backoff-max`` (10 s) bounds the wait between reconnects on deviced as
    on noded; and ``--node-ip`` goes into the Hello of both."""
    from noded.app import NodeD
    from noded.app import build_parser as noded_parser

    dev = DeviceD(build_parser().parse_args(BASE), SimBackend(1, 1)).agent
    assert (dev.backoff_max_s, dev.hello.node_ip) == (10.0, "")
    argv = ["--clusterd-backoff-max", "2.5", "--node-ip", "10.0.0.5"]
    dev = DeviceD(build_parser().parse_args([*BASE, *argv]), SimBackend(1, 1)).agent
    nod = NodeD(noded_parser().parse_args(["--node-name", "n", "--clusterd", "127.0.0.1:1", *argv])).agent
    assert (
        (dev.backoff_max_s, dev.hello.node_ip) == (nod.backoff_max_s, nod.hello.node_ip) == (2.5, "10.0.0.5")
    )
