"""The ``faultmesh`` operator CLI.

Each subcommand group lives in its own module under ``fmtools.cli`` and exposes
``register(subparsers)``, which adds its parsers and sets ``func`` (a callable taking the parsed
args and returning an exit status). The explicit tuple below is the registry (no import side effects).

``--version`` works on ``faultmesh`` and on every command; shell completion comes from argcomplete
(``eval "$(faultmesh completion bash)"``); exit codes are in :data:`fmtools.cli.common.EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Module names under fmtools.cli, one per command group. Add one line per new group.
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
    "release",
    "history",
    "completion",
)


def build_parser() -> argparse.ArgumentParser:
    """The full ``faultmesh`` parser with every registered command group (``--version`` on each)."""
    from faultmesh.metrics import version
    from fmtools.cli.common import EXIT_CODES

    parser = argparse.ArgumentParser(
        prog="faultmesh",
        description="faultmesh operator CLI",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    text = f"faultmesh {version()}"
    parser.add_argument("--version", action="version", version=text)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"fmtools.cli.{name}").register(sub)
    todo = list(sub.choices.values())
    while todo:  # every command and sub-command answers --version too
        p = todo.pop()
        if "--version" not in p._option_string_actions:
            p.add_argument("--version", action="version", version=text, help=argparse.SUPPRESS)
        p.set_defaults(_cli_parser=p)  # the deepest command parsed names itself (see main)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(a.choices.values())
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``argv`` parsed by ``parser`` (:func:`build_parser`); exits 2 with the command's own usage line
    for what no argument takes. An optional positional (``nargs="?"``) after a flag is filled too:
    argparse fills those only from the words right after the positional before them, so
    ``faultmesh trace on --light ns/job`` or ``faultmesh ack n1 --reason r CODE`` left the last word
    'unrecognized'. Each still-empty one takes, in order, the next left-over word that is not a flag
    (type and choices checked as argparse does)."""
    args, extra = parser.parse_known_args(argv)
    cmd = getattr(args, "_cli_parser", parser)
    for action in cmd._actions:
        if not extra or action.option_strings or action.nargs != "?":
            continue
        word = next((w for w in extra if not w.startswith("-")), None)
        if word is None or getattr(args, action.dest, None) != action.default:
            continue
        try:
            setattr(args, action.dest, cmd._get_values(action, [word]))
        except argparse.ArgumentError as e:
            cmd.error(str(e))
        extra.remove(word)
    if extra:  # an unknown flag after a command: that command's usage line, not the top-level one
        cmd.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``faultmesh`` console script. Returns the exit status."""
    parser = build_parser()
    try:
        import argcomplete  # completion: a no-op unless the shell asks (_ARGCOMPLETE set)

        argcomplete.autocomplete(parser)
    except ImportError:
        pass
    args = parse(parser, argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
