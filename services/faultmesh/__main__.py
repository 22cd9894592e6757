"""``python -m faultmesh`` — same as the ``faultmesh`` console script."""

import sys

from faultmesh.cli import main

if __name__ == "__main__":
    sys.exit(main())
