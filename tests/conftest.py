"""Shared test fixtures: free loopback ports, the shared data folder, uvloop for async tests."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import uvloop

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FAULT_TABLES = SHARED / "data" / "fault-tables"


def pytest_asyncio_loop_factories(config, item):
    """Run async tests on uvloop, as the daemons do."""
    return {"uvloop": uvloop.new_event_loop}


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fault_tables() -> Path:
    """../shared/data/fault-tables (read-only reference tables)."""
    if not FAULT_TABLES.is_dir():
        pytest.skip("../shared/data/fault-tables not present")
    return FAULT_TABLES
