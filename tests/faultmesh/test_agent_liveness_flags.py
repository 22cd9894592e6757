"""The agents' reconnect and liveness flags between hosts are range-checked at start (issue 29, bad
input): ``--clusterd-backoff-max`` 0.5..3600 s, ``--clusterd-keepalive-s`` and
``--clusterd-keepalive-timeout-s`` positive, ``--clusterd-heartbeat-s`` >= 0 (0: off). A zero,
negative or NaN value was taken silently before (the backoff clamped to 0.5 s, a negative keepalive
passed to gRPC, a NaN timeout 'configuration error' without the flag's name)."""

from __future__ import annotations

import pytest

from deviced.app import build_parser as deviced_parser
from noded.app import build_parser as noded_parser

PARSERS = {"noded": noded_parser, "deviced": deviced_parser}


@pytest.mark.parametrize("daemon", sorted(PARSERS))
@pytest.mark.parametrize(
    "flag, value, expect",
    [
        ("--clusterd-backoff-max", "0", "'0' is not a number in 0.5..3600"),
        ("--clusterd-backoff-max", "-1", "'-1' is not a number in 0.5..3600"),
        ("--clusterd-backoff-max", "7200", "'7200' is not a number in 0.5..3600"),
        ("--clusterd-backoff-max", "nan", "'nan' is not a number in 0.5..3600"),
        ("--clusterd-keepalive-s", "-1", "'-1' is not a positive number"),
        ("--clusterd-keepalive-s", "0", "'0' is not a positive number"),
        ("--clusterd-keepalive-timeout-s", "nan", "'nan' is not a positive number"),
        ("--clusterd-heartbeat-s", "-1", "'-1' is not a number >= 0"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag(capsys, daemon, flag, value, expect):
    with pytest.raises(SystemExit) as e:
        PARSERS[daemon]().parse_args(["--node-name", "n", f"{flag}={value}"])
    assert e.value.code == 2
    assert f"error: argument {flag}: {expect}" in capsys.readouterr().err


@pytest.mark.parametrize("daemon", sorted(PARSERS))
def test_edge_values_are_taken(daemon):
    argv = ["--node-name", "n", "--clusterd-backoff-max", "0.5", "--clusterd-heartbeat-s", "0"]
    args = PARSERS[daemon]().parse_args([*argv, "--clusterd-keepalive-s", "0.5"])
    got = (args.clusterd_backoff_max, args.clusterd_heartbeat_s, args.clusterd_keepalive_s)
    assert got == (0.5, 0.0, 0.5)
    args = PARSERS[daemon]().parse_args(["--node-name", "n", "--clusterd-backoff-max", "3600"])
    assert args.clusterd_backoff_max == 3600.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "601"])
def test_noded_bmc_backoff_base_is_checked(capsys, value):
    """noded's BMC retry ``--backoff-base`` (1 s, 0.1..600): 0 and -1 stopped noded with 'configuration
    error' without the flag's name, NaN was taken (retry delays of NaN)."""
    with pytest.raises(SystemExit) as e:
        noded_parser().parse_args(["--node-name", "n", f"--backoff-base={value}"])
    assert e.value.code == 2
    assert f"error: argument --backoff-base: '{value}' is not a number in 0.1..600" in capsys.readouterr().err
