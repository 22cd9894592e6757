"""The ``faultmesh`` operator CLI.

Each subcommand group lives in its own module under ``faultmesh.cli`` and exposes
``register(subparsers)``, which adds its parsers and sets ``func`` (a callable taking the parsed
args and returning an exit status). The explicit tuple below is the registry (no import side effects).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Module names under faultmesh.cli, one per command group. Add one line per new group.
COMMAND_MODULES: tuple[str, ...] = (
    "faults",
    "pubfault",
    "jobs",
    "trainsim",
    "trace",
    "switch_nic",
    "stress_test",
    "bmc_sim",
    "pingmesh",
    "slownode",
    "up",
    "device_sim",
    "explain",
    "history",
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``faultmesh`` parser with every registered command group."""
    parser = argparse.ArgumentParser(prog="faultmesh", description="faultmesh operator CLI")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"faultmesh.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``faultmesh`` console script. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
