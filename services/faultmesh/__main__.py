"""``python -m faultmesh`` — same as the ``faultmesh`` console script (:mod:`fmtools.cli`).

The one module of the core that reaches the tools: it is run, never imported, and loads the CLI
only then (tests/test_shape.py allows exactly this file).
"""

import sys


def main() -> int:
    """Run the operator CLI with ``sys.argv``; returns its exit status."""
    from fmtools.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
