"""Conformance tests: the brain tests' in-process ClusterD (short recovery timeouts), its gRPC
channel and TaskD/MindIO-faithful trainsims (tests/brain/conftest.py), shared, not copied."""

from __future__ import annotations

from brain.conftest import cd, channel, sims, target  # noqa: F401 (fixtures)
