"""In-process ClusterD for tests: ``cd`` is started on free loopback ports and stopped after the test."""

from __future__ import annotations

import pytest
from support import free_port

from clusterd.app import ClusterD, _load_component_classes, build_parser


async def make_clusterd(tmp_path, *extra: str) -> ClusterD:
    """Start a ClusterD with every registered component on free ports; the caller stops it."""
    classes = _load_component_classes()
    args = build_parser(classes).parse_args(
        [
            "--grpc-addr",
            f"127.0.0.1:{free_port()}",
            "--http-addr",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            str(tmp_path / "state"),
            *extra,
        ]
    )
    cd = ClusterD(args, classes)
    await cd.start()
    return cd


@pytest.fixture
async def cd(tmp_path):
    c = await make_clusterd(tmp_path)
    yield c
    await c.stop()
