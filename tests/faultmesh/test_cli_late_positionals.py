"""An optional positional after a flag is taken (fmtools.cli.parse): argparse fills a ``nargs="?"``
positional only from the words right after the one before it, so ``faultmesh trace on --light
default/job`` ended 'unrecognized arguments: default/job' (found writing the multi-host test, issue
29) and ``faultmesh ack n1 --reason r --for 2h CODE`` the same with the code."""

from __future__ import annotations

import pytest
from support import cli_inproc

from fmtools.cli import build_parser, parse


@pytest.mark.parametrize(
    "argv, want",
    [
        (
            ["trace", "on", "--light", "default/job"],
            {"action": "on", "job_pos": "default/job", "light": True},
        ),
        (
            ["trace", "on", "default/job", "--light"],
            {"action": "on", "job_pos": "default/job", "light": True},
        ),
        (["ack", "n1", "--reason", "r", "--for", "2h", "80E18008"], {"node": "n1", "code": "80E18008"}),
        (["ack", "--reason", "r", "n1", "--for", "2h", "80E18008"], {"node": "n1", "code": "80E18008"}),
        (["explain", "xid", "--json", "79"], {"code": "xid", "arg": "79", "json": True}),
    ],
)
def test_late_optional_positionals_are_taken(argv, want):
    args = parse(build_parser(), argv)
    assert {k: getattr(args, k) for k in want} == want


def test_what_nothing_takes_is_still_a_usage_error(capsys):
    r = cli_inproc(capsys, "trace", "on", "--light", "default/job", "surplus")
    assert r.returncode == 2 and "faultmesh trace: error: unrecognized arguments: surplus" in r.stderr
    r = cli_inproc(capsys, "trace", "--light", "default/job", "on")  # on is not NAMESPACE/JOB's turn
    assert r.returncode == 2 and "invalid choice: 'default/job'" in r.stderr, r.stderr
    r = cli_inproc(capsys, "trace", "on", "--bogus", "default/job")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr, r.stderr
