"""``python -m clusterd`` — same as the ``clusterd`` console script."""

import sys

from clusterd.app import main

if __name__ == "__main__":
    sys.exit(main())
