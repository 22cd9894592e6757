"""``python -m deviced`` — same as the ``deviced`` console script."""

import sys

from deviced.app import main

if __name__ == "__main__":
    sys.exit(main())
