"""In-process ClusterD for tests: ``cd`` is started on free loopback ports and stopped after the test."""

from __future__ import annotations

import pytest
from support import make_clusterd


@pytest.fixture
async def cd(tmp_path):
    c = await make_clusterd(tmp_path)
    yield c
    await c.stop()
