"""noded test fixtures (helpers in noded_support.py, on ``pythonpath``: pyproject.toml)."""

from __future__ import annotations

import pytest
from noded_support import BmcSim


@pytest.fixture(scope="session")
def _bmc_sim_process(tmp_path_factory):
    sim = BmcSim(tmp_path_factory.mktemp("bmc-sim")).start()
    yield sim
    sim.stop()


@pytest.fixture
def bmc_sim(_bmc_sim_process):
    """One bmc-sim process for the session, reset (no alarms, empty SEL, default behaviour) per test."""
    if _bmc_sim_process.proc.poll() is not None:
        _bmc_sim_process.start(_bmc_sim_process.port)
    _bmc_sim_process.call("/reset", {})
    return _bmc_sim_process
