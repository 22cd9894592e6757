"""Metrics and the rejection counter shared by the parts of Kubernetes mode."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from faultmesh.log import RateLimitedLog

log = logging.getLogger("clusterd.kube")


class KubeMetrics:
    """``faultmesh_kube_writes_total{kind,result}``, ``faultmesh_kube_api_errors_total{op,status}``,
    ``faultmesh_kube_watch_restarts_total{watch,why}``, ``faultmesh_kube_published_shards{kind}``;
    :meth:`reject` counts ``faultmesh_rejected_requests_total{service="kube",reason}`` via ``reject_fn``."""

    def __init__(self, registry: CollectorRegistry, reject_fn: Callable[[str, str], None]) -> None:
        self.writes = Counter(
            "faultmesh_kube_writes_total",
            "Kubernetes writes by object kind and result",
            ["kind", "result"],
            registry=registry,
        )
        self.api_errors = Counter(
            "faultmesh_kube_api_errors_total",
            "Failed Kubernetes API calls",
            ["op", "status"],
            registry=registry,
        )
        self.restarts = Counter(
            "faultmesh_kube_watch_restarts_total",
            "Watch restarts: expired and error re-list, ended resumes",
            ["watch", "why"],
            registry=registry,
        )
        self.shards = Gauge(
            "faultmesh_kube_published_shards", "Published cluster-info shards", ["kind"], registry=registry
        )
        self._reject_fn = reject_fn
        self._ratelog = RateLimitedLog(log)

    def reject(self, reason: str, **kv: Any) -> None:
        """Count and (rate-limited) log one rejected Kubernetes object."""
        self._reject_fn("kube", reason)
        self._ratelog.warning(reason, "kube configmap rejected", **kv)
