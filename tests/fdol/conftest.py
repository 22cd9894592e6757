"""fdol tests: the bench's simulators and detection runs (bench/trainsim_tp.py, trainsim_dp.py,
slownode_realistic.py, slownode_dp.py) importable by their names. This folder's helper modules
(slownode_gen, slownode_support) are on ``pythonpath`` (pyproject.toml)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")


def _bench_modules(*names: str) -> None:
    """Import ``bench/<name>.py`` as module ``name`` for each of ``names``; bench/ is on ``sys.path``
    only meanwhile (its scripts import their siblings by bare name, and some put bench/ there
    themselves). Left there, a bench script would shadow any test helper package of the same name
    in every later import (bench/brain.py hid tests/brain: a namespace package loses to a module
    found anywhere on the path)."""
    sys.path.insert(0, _BENCH)
    try:
        for name in names:
            importlib.import_module(name)
    finally:
        sys.path[:] = [p for p in sys.path if p != _BENCH]


_bench_modules("trainsim_tp", "trainsim_dp", "slownode_realistic", "slownode_dp")
