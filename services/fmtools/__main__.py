"""``python -m fmtools`` — same as the ``faultmesh`` console script."""

import sys

from fmtools.cli import main

if __name__ == "__main__":
    sys.exit(main())
