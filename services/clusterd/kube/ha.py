"""clusterd as 2+ replicas (issue 15 HA): ``clusterd --kube --kube-leader-elect on``.

Every replica runs :func:`run_replica`: a :class:`~faultmesh.lease.LeaseElector` on the Lease
``--kube-lease-namespace``/``--kube-lease-name`` and, by turns:

- **follower** (standby): the gRPC and HTTP addresses are bound by a small standby server that
  refuses every RPC with ``UNAVAILABLE`` naming the leader, answers mutating HTTP with 503, and
  serves ``/healthz`` (200), ``/readyz`` (503 ``follower``: the Service routes to the leader only)
  and ``/metrics`` (:mod:`clusterd.kube.gate`). No state, no watch, no write.
- **leader**: once the Lease is held, the standby stops, a fresh SQLite file is filled from the
  state ConfigMap (:mod:`clusterd.kube.hastate`), and the full ClusterD starts on it with a
  :class:`~clusterd.kube.hastate.MirroredStore` (every durable change written to the ConfigMap
  before it is acknowledged) and a history mirror (:mod:`clusterd.kube.hahistory`: the fault history
  and the decision log, imported at election, written after the fact); the agents reconnect and send
  their snapshots. Only the leader runs the Kubernetes writers (:mod:`clusterd.kube.leader`).
- leadership lost (renewal failed past the renew deadline, or another holder): ClusterD stops
  (its gate refuses meanwhile) and the replica is a follower again.

A crashed leader's Lease is taken over after ``--kube-lease-s`` plus one retry period (2 s); the
chart sets 8 s, so a follower leads within about 12 s of a ``kill -9`` and serves a second or so
later. A graceful stop releases the Lease: the follower takes over at its next retry.

Metrics (on the standby's and the leader's ``/metrics``): ``faultmesh_clusterd_leader`` (1 while
leading), ``faultmesh_kube_lease_errors_total{status}`` (failed Lease calls, retried every 2 s) and
the state ConfigMap's counters (:class:`~clusterd.kube.hastate.StateMetrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.api.grpcserver import bind_grpc, server_options
from clusterd.coreconfig import CoreConfig
from clusterd.kube import leader as kleader
from clusterd.kube.config import KubeConfig
from clusterd.kube.gate import FollowerGate
from clusterd.kube.hahistory import HistoryMetrics, HistoryMirror, HistoryStore
from clusterd.kube.hastate import KubeState, MirroredStore, StateMetrics, StateWriteError
from clusterd.kube.leader import Election, LeaderConfig
from faultmesh.httpd import HttpServer, rejected_counter
from faultmesh.kube import KubeApi, make_api_client
from faultmesh.lease import LeaseElector
from faultmesh.log import event
from faultmesh.metrics import daemon_registry
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.kube.ha")

MakeClusterD = Callable[[MirroredStore, LeaseElector], Any]
"""``make(store, elector)`` -> a not yet started ClusterD using them (clusterd.app passes its own)."""


class HaMetrics:
    """The replica's own metrics (see the module docstring), kept in :attr:`registry` and added to
    each ClusterD's registry with :meth:`register`."""

    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        self.state = StateMetrics(reg)
        self.history = HistoryMetrics(reg)
        self.leader = Gauge("faultmesh_clusterd_leader", "1 while this replica holds the Lease", registry=reg)
        self.lease_errors = Counter(
            "faultmesh_kube_lease_errors_total", "Failed Lease calls (retried)", ["status"], registry=reg
        )

    def _collectors(self) -> tuple:
        st = self.state
        return (
            st.writes,
            st.retries,
            st.rejected,
            st.bytes,
            self.leader,
            self.lease_errors,
            *self.history.collectors(),
        )

    def register(self, registry: CollectorRegistry) -> None:
        for c in self._collectors():
            registry.register(c)

    def unregister(self, registry: CollectorRegistry) -> None:
        for c in self._collectors():
            with contextlib.suppress(KeyError):
                registry.unregister(c)


class Standby:
    """The follower's servers on ``--grpc-addr`` / ``--http-addr`` (see the module docstring)."""

    def __init__(self, core: CoreConfig, elector: LeaseElector, metrics: HaMetrics) -> None:
        self.core = core
        self.registry = daemon_registry("clusterd")
        metrics.register(self.registry)
        self._metrics = metrics
        rejected = rejected_counter(self.registry)
        self.gate = FollowerGate(Election(elector), lambda s, r: rejected.labels(s, r).inc(), always=True)
        self.http = HttpServer(
            core.http_addr, self.registry, ready=lambda: self.gate.ready(False, "starting"), rejected=rejected
        )
        self.http.app.middlewares.append(self.gate.http_middleware())
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Bind both addresses. Raises ``OSError``."""
        a = self.core
        await self.http.start()
        server = grpc.aio.server(
            options=server_options(a.max_connections, a.grpc_keepalive_s, a.grpc_keepalive_timeout_s),
            interceptors=[self.gate.interceptor()],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            bind_grpc(server, a.grpc_addr, a.tls_cert, a.tls_key, a.tls_ca)
        except OSError:
            await self.http.stop()
            raise
        await server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server = server

    async def stop(self) -> None:
        """Unbind (the leader's servers take the addresses next)."""
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
        await self.http.stop()
        self._metrics.unregister(self.registry)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def run_replica(core: CoreConfig, kube: KubeConfig, make: MakeClusterD, stop: asyncio.Event) -> int:
    """One replica until ``stop`` is set (see the module docstring), with ClusterD's section
    ``core`` and the Kubernetes one ``kube`` (``kube.replicated``). Returns the exit status: 0, or
    1 when the API client cannot be configured, an address cannot be bound, or the leader's
    ClusterD fails to start (the Lease is released first, so another replica takes over)."""
    try:
        api_client = await make_api_client(kube.kube_api, kube.kubeconfig)
    except OSError as e:
        event(log, logging.ERROR, "clusterd failed to start", error=str(e))
        return 1
    api = KubeApi(api_client, timeout_s=kube.kube_timeout_s)
    lc = kube.leader
    metrics = HaMetrics()
    elector = LeaseElector(
        api, lc.kube_lease_namespace, lc.kube_lease_name, kleader.identity(), lease_s=lc.kube_lease_s,
        on_error=lambda e: metrics.lease_errors.labels(str(e.status)).inc(),
    )  # fmt: skip
    lost = asyncio.Event()

    def changed(leading: bool) -> None:
        metrics.leader.set(1 if leading else 0)
        if not leading:
            lost.set()

    elector.listeners.append(changed)
    lease_task = asyncio.create_task(elector.run(), name="kube-lease")
    rc = 0
    try:
        while not stop.is_set():
            standby = Standby(core, elector, metrics)
            try:
                await standby.start()
            except OSError as e:
                event(log, logging.ERROR, "clusterd failed to start", error=str(e))
                return 1
            event(log, logging.INFO, "clusterd follower", identity=elector.identity, leader=elector.holder)
            await _first(stop, elector.leading)
            await standby.stop()
            if stop.is_set():
                break
            lost.clear()
            rc = await _lead(core, lc, make, api, elector, metrics, lost, stop)
            if rc:
                return rc
        return 0
    finally:
        with contextlib.suppress(Exception):
            await wait_for(elector.release(), kube.kube_timeout_s + 1)
        lease_task.cancel()
        await asyncio.wait([lease_task], timeout=5)
        await api_client.close()


async def _lead(core: CoreConfig, lc: LeaderConfig, make: MakeClusterD, api: KubeApi, elector: LeaseElector,
                metrics: HaMetrics, lost: asyncio.Event, stop: asyncio.Event) -> int:  # fmt: skip
    """Run ClusterD while leading. Returns 1 when it could not start (after releasing the Lease)."""
    state = KubeState(
        api, lc.kube_lease_namespace, lc.kube_state_name, elector.identity, elector.leading.is_set,
        metrics.state, max_bytes=lc.kube_state_max_bytes, write_s=lc.kube_state_write_s,
    )  # fmt: skip
    history = HistoryMirror(
        api, lc.kube_lease_namespace, lc.kube_history_name or f"{lc.kube_state_name}-history",
        elector.identity, elector.leading.is_set, metrics.history, max_bytes=lc.kube_state_max_bytes,
        write_s=lc.kube_state_write_s, max_events=lc.kube_history_max_events,
        max_decisions=lc.kube_history_max_decisions, window_s=lc.kube_history_window_s,
        interval_s=lc.kube_history_write_interval_s,
    )  # fmt: skip
    try:
        store: MirroredStore = HistoryStore(
            state, history, core.state_dir, fsync_full=core.fsync_full,
            busy_timeout_ms=core.state_busy_timeout_ms,
        )  # fmt: skip
        cd = make(store, elector)
    except OSError as e:  # an unreadable token / TLS / table file named by a flag
        event(log, logging.ERROR, "clusterd failed to start", error=str(e))
        await elector.release()
        return 1
    metrics.register(cd.registry)
    try:
        await cd.start()
    except (OSError, StateWriteError) as e:
        event(log, logging.ERROR, "clusterd failed to start", error=str(e))
        await cd.stop()
        await elector.release()
        return 1
    event(log, logging.INFO, "clusterd leads", identity=elector.identity, restored=store.restored)
    await _first(stop, lost)
    if not stop.is_set():
        event(log, logging.WARNING, "clusterd steps down", identity=elector.identity)
    await cd.stop()
    return 0
