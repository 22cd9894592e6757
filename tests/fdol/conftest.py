"""fdol tests: make the helper modules of this folder (slownode_gen) importable."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")  # bench/trainsim_tp.py: the realistic simulator
if _BENCH not in sys.path:
    sys.path.append(_BENCH)
