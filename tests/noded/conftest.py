"""noded test fixtures (helpers in noded_support.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # noded_support, next to this file

from noded_support import BmcSim  # noqa: E402


@pytest.fixture
def bmc_sim(tmp_path):
    sim = BmcSim(tmp_path).start()
    yield sim
    sim.stop()
