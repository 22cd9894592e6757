"""Shared test fixtures: free loopback ports, the shared data folder, uvloop for async tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import uvloop
from support import FAULT_TABLES, ClusterdProcess, free_port


def pytest_asyncio_loop_factories(config, item):
    """Run async tests on uvloop, as the daemons do."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fault_tables() -> Path:
    """../shared/data/fault-tables (read-only reference tables)."""
    if not FAULT_TABLES.is_dir():
        pytest.skip("../shared/data/fault-tables not present")
    return FAULT_TABLES


@pytest.fixture
def clusterd_process(tmp_path):
    """Factory: ``clusterd_process(*extra_flags)`` starts a real clusterd; all are stopped at teardown."""
    procs: list[ClusterdProcess] = []

    def start(*extra: str, state_dir: Path | None = None) -> ClusterdProcess:
        p = ClusterdProcess(state_dir or tmp_path / "state", list(extra)).start()
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()
