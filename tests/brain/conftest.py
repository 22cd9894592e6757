"""Brain tests: an in-process ClusterD with short recovery timeouts, a gRPC channel and trainsims."""

from __future__ import annotations

import grpc
import pytest
from brain.brainkit import FAST, Sims
from support import make_clusterd


@pytest.fixture
async def cd(tmp_path):
    c = await make_clusterd(tmp_path, *FAST)
    yield c
    await c.stop()


@pytest.fixture
def target(cd) -> str:
    return f"127.0.0.1:{cd.grpc_port}"


@pytest.fixture
async def channel(target):
    ch = grpc.aio.insecure_channel(target)
    yield ch
    await ch.close()


@pytest.fixture
async def sims(target):
    s = Sims(target)
    yield s
    await s.close()
