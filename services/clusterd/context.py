"""The cluster context: the one set of shared parts every ClusterD component is built with (issue 12).

:class:`ClusterContext` is frozen and built once, in :mod:`clusterd.app`; a component receives it
plus the specific peers it needs as explicit constructor arguments (the brain's job registry, the
PubFault intake, ...), never the app object. Fields: ``config`` (the parsed command line, read by
the brain alone: every other component is given its typed section, :func:`faultmesh.config.section`),
``store`` (state file), ``center`` (fault center), ``nodes`` (node registry), ``agents`` (the agent
stream: ``send`` control messages, ``connected`` agents, ``on_*`` hooks), ``tasks`` (the owner of
every background task), ``http`` (the HTTP server: routes), ``metrics`` (registry and the shared
rejected-requests counter), ``auth`` (the bearer token).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from clusterd.auth import TokenAuth
from clusterd.center import FaultCenter
from clusterd.ingest.agents import AgentHub
from clusterd.nodes import NodeRegistry
from clusterd.store import Store
from faultmesh.httpd import HttpServer
from faultmesh.runtime import TaskOwner


@dataclass(frozen=True)
class Metrics:
    """``registry``: ClusterD's Prometheus registry; ``rejected``:
    ``faultmesh_rejected_requests_total{service,reason}``."""

    registry: CollectorRegistry
    rejected: Counter

    def reject(self, service: str, reason: str) -> None:
        """Count one rejected request of ``service`` for ``reason``."""
        self.rejected.labels(service, reason).inc()


@dataclass(frozen=True)
class ClusterContext:
    """See the module docstring."""

    config: argparse.Namespace
    store: Store
    center: FaultCenter
    nodes: NodeRegistry
    agents: AgentHub
    tasks: TaskOwner
    http: HttpServer
    metrics: Metrics
    auth: TokenAuth
