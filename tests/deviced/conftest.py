"""deviced test fixtures: the compiled test DCMI library (session) and a fresh device state per test."""

from __future__ import annotations

import pytest
from native.build import NativeLibs, build_libs


@pytest.fixture(scope="session")
def native_libs() -> NativeLibs:
    """Build (once per source hash) and return the test libdcmi.so / liblingqu-dcmi.so paths."""
    try:
        return build_libs()
    except FileNotFoundError as e:
        pytest.skip(str(e))
