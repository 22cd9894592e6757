"""The one way a faultmesh daemon builds its Prometheus registry (issue 17 "Metrics and alerts").

:func:`daemon_registry` returns a fresh ``CollectorRegistry`` with

- ``process_*`` (CPU, memory, open fds, start time: ``ProcessCollector``) on every daemon;
- ``faultmesh_build_info{service,version,python} 1``: which build answers the scrape (and a series
  a meta-alert can miss: ``absent(faultmesh_build_info{service="clusterd"})``).

It also switches off prometheus_client's ``*_created`` series process-wide (one per counter and
histogram child: noise that doubles the series of every counter and that no rule reads).
"""

from __future__ import annotations

import platform
from importlib import metadata

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector


def version() -> str:
    """faultmesh's installed version (``0.0.0+unknown`` when run from a tree that was never installed)."""
    try:
        return metadata.version("faultmesh")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def daemon_registry(service: str) -> CollectorRegistry:
    """A registry for ``service`` (``clusterd``, ``noded``, ``deviced``) with process metrics and
    ``faultmesh_build_info``; ``*_created`` series are disabled."""
    prometheus_client.disable_created_metrics()
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    Gauge(
        "faultmesh_build_info",
        "1: the faultmesh build that serves this endpoint",
        ["service", "version", "python"],
        registry=registry,
    ).labels(service, version(), platform.python_version()).set(1)
    return registry
