"""``faultmesh completion bash|zsh|fish``: the shell code that completes faultmesh (argcomplete).

``eval "$(faultmesh completion bash)"`` in ``~/.bashrc`` (zsh: the same with ``zsh``; fish:
``faultmesh completion fish | source``).
"""

from __future__ import annotations

import argparse
import sys

from fmtools.cli.common import CliError, run


@run
def cmd_completion(args: argparse.Namespace) -> int:
    """Print the completion code for ``args.shell``."""
    try:
        import argcomplete
    except ImportError:
        raise CliError("shell completion needs argcomplete (pip install argcomplete)") from None
    sys.stdout.write(argcomplete.shellcode(["faultmesh"], shell=args.shell))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print shell completion code (eval it in your shell's rc file)")
    p.add_argument("shell", choices=("bash", "zsh", "fish"))
    p.set_defaults(func=cmd_completion)
