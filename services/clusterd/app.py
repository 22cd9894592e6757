"""ClusterD: the cluster brain (issue 2; design.md "Processes").

``clusterd --grpc-addr 127.0.0.1:8899 --http-addr 127.0.0.1:8080 --state-dir DIR`` (the defaults;
``--state-dir`` defaults to ``$XDG_STATE_HOME/faultmesh/clusterd``). Every flag also reads
``FAULTMESH_<FLAG>`` and a YAML ``--config``. Start order: state file -> fault center (restored) ->
components -> HTTP -> gRPC; SIGTERM stops gRPC (streams drained for ``--drain-s``), components, HTTP,
and closes the state file.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import importlib
import logging
import os
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector

from clusterd.agents import AgentHub
from clusterd.center import FaultCenter, NodeHealthCollector
from clusterd.components import COMPONENTS
from clusterd.grpcserver import RateLimitInterceptor, server_credentials, server_options
from clusterd.http_api import setup_routes
from clusterd.store import Store
from faultmesh import config, runtime
from faultmesh import log as fmlog
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.httpd import HttpServer
from faultmesh.log import event

log = logging.getLogger("clusterd")


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/faultmesh/clusterd`` (``~/.local/state/...`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "faultmesh", "clusterd")


def _load_component_classes() -> list[type]:
    classes = []
    for spec in COMPONENTS:
        mod, _, cls = spec.partition(":")
        try:
            classes.append(getattr(importlib.import_module(mod), cls))
        except (ImportError, AttributeError) as e:
            event(log, logging.ERROR, "component not loaded", component=spec, error=repr(e))
    return classes


def build_parser(component_classes: list[type]) -> argparse.ArgumentParser:
    """The clusterd command line (core flags + every component's flags)."""
    p = argparse.ArgumentParser(prog="clusterd", description="faultmesh ClusterD: the cluster brain")
    p.add_argument("--grpc-addr", default="127.0.0.1:8899", help="gRPC listen address (host:port)")
    p.add_argument("--http-addr", default="127.0.0.1:8080", help="HTTP listen address for /metrics, /v1/...")
    p.add_argument("--state-dir", default=default_state_dir(), help="folder of the SQLite state file")
    p.add_argument("--fsync-full", action="store_true", help="fsync every commit (survives power loss)")
    p.add_argument("--tls-cert", help="PEM server certificate: enables TLS on gRPC")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", help="PEM CA: clients must present a certificate it signed (mTLS)")
    p.add_argument("--token-file", help="bearer token that mutating RPCs and agents must send")
    p.add_argument("--drain-s", type=float, default=5.0, help="grace period for streams on shutdown (s)")
    p.add_argument("--unary-qps", type=float, default=1000.0, help="shared unary token bucket (req/s)")
    p.add_argument("--max-connections", type=int, default=1024, help="gRPC connections accepted at once")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-file", help="also log to this file (rotated at 20 MiB, 5 kept)")
    for cls in component_classes:
        cls.add_arguments(p)
    return p


class ClusterD:
    """One ClusterD process: state, fault center, agent hub, components, HTTP and gRPC servers.

    Attributes used by components: ``args``, ``registry``, ``store``, ``center``, ``agents``,
    ``http``, ``tasks``, ``rejected``; methods ``add_servicer`` and ``authorized``.
    """

    def __init__(self, args: argparse.Namespace, component_classes: list[type] | None = None) -> None:
        self.args = args
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.rejected = Counter(
            "faultmesh_rejected_requests_total",
            "Rejected requests by service and reason",
            ["service", "reason"],
            registry=self.registry,
        )
        self.up = Gauge("faultmesh_clusterd_ready", "1 when ClusterD serves", registry=self.registry)
        self.store = Store(args.state_dir, fsync_full=args.fsync_full)
        self.center = FaultCenter(self.store, self.registry)
        self.agents = AgentHub(self.center, self.registry, self.rejected)
        self.agents.authorize = self.authorized
        self.registry.register(
            NodeHealthCollector(
                self.center,
                lambda: {n: i.get("node_status", "") for n, i in self.agents.known.items()},
            )
        )
        self.tasks = runtime.TaskOwner("clusterd")
        self._ready = False
        self.http = HttpServer(
            args.http_addr, self.registry, ready=lambda: (self._ready, "ready" if self._ready else "starting")
        )
        self._token = config.read_secret(args.token_file) if args.token_file else None
        self._servicers: list[tuple] = [(agent_pb2_grpc.add_AgentStreamServicer_to_server, self.agents)]
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        setup_routes(self)
        classes = component_classes if component_classes is not None else _load_component_classes()
        self.components = [cls(self) for cls in classes]
        self.grpc_port = 0
        self._server: grpc.aio.Server | None = None

    def add_servicer(self, add_fn, servicer) -> None:
        """Register a gRPC servicer (called from a component's ``__init__``)."""
        self._servicers.append((add_fn, servicer))

    def authorized(self, context) -> bool:
        """True when no token is configured or the call carries ``authorization: Bearer <token>``."""
        if not self._token:
            return True
        for k, v in context.invocation_metadata() or ():
            if k == "authorization" and hmac.compare_digest(v, f"Bearer {self._token}"):
                return True
        return False

    async def start(self) -> None:
        """Open state, restore faults, start components, HTTP, then gRPC. Raises ``OSError`` on bind."""
        await self.store.open()
        n = await self.center.load()
        self.tasks.spawn(self.center.run(), name="fault-center-writer")
        for c in self.components:
            await c.start()
        await self.http.start()
        server = grpc.aio.server(
            options=server_options(self.args.max_connections),
            interceptors=[RateLimitInterceptor(self.rejected, unary_rate=self.args.unary_qps)],
        )
        for add_fn, servicer in self._servicers:
            add_fn(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [
            health.SERVICE_NAME,
            reflection.SERVICE_NAME,
            agent_pb2.DESCRIPTOR.services_by_name["AgentStream"].full_name,
        ]
        for _, servicer in self._servicers:
            for base in type(servicer).__mro__:
                if base.__name__.endswith("Servicer") and base.__module__.startswith("faultmesh._pb"):
                    mod = importlib.import_module(base.__module__.replace("_grpc", ""))
                    names.extend(s.full_name for s in mod.DESCRIPTOR.services_by_name.values())
        reflection.enable_server_reflection(sorted(set(names)), server)
        try:
            if self.args.tls_cert:
                creds = server_credentials(self.args.tls_cert, self.args.tls_key, self.args.tls_ca)
                self.grpc_port = server.add_secure_port(self.args.grpc_addr, creds)
            else:
                self.grpc_port = server.add_insecure_port(self.args.grpc_addr)
        except RuntimeError as e:  # grpcio raises this when the port is taken
            raise OSError(f"cannot bind gRPC address {self.args.grpc_addr}: {e}") from None
        if not self.grpc_port:
            raise OSError(f"cannot bind gRPC address {self.args.grpc_addr}")
        await server.start()
        self._server = server
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._ready = True
        self.up.set(1)
        event(
            log,
            logging.INFO,
            "clusterd started",
            grpc=self.args.grpc_addr,
            grpc_port=self.grpc_port,
            http=f"{self.http.host}:{self.http.port}",
            state=self.store.path,
            faults_restored=n,
            tls=bool(self.args.tls_cert),
            components=",".join(c.name for c in self.components),
        )

    async def stop(self) -> None:
        """Drain and stop gRPC, stop components and HTTP, flush and close the state file."""
        self._ready = False
        self.up.set(0)
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            await self._server.stop(self.args.drain_s)
        for c in reversed(self.components):
            try:
                await asyncio.wait_for(c.stop(), 5.0)
            except Exception as e:
                event(log, logging.ERROR, "component stop failed", component=c.name, error=repr(e))
        await self.http.stop()
        await self.tasks.close()
        await self.store.close()
        event(log, logging.INFO, "clusterd stopped")


def main(argv: list[str] | None = None) -> int:
    """Console script ``clusterd``."""
    classes = _load_component_classes()
    args = config.parse(build_parser(classes), argv)
    fmlog.setup(args.log_level, args.log_file)
    Path(args.state_dir).mkdir(parents=True, exist_ok=True)

    async def _main(stop: asyncio.Event) -> int:
        cd = ClusterD(args, classes)
        try:
            await cd.start()
        except OSError as e:
            event(log, logging.ERROR, "clusterd failed to start", error=str(e))
            await cd.stop()
            return 1
        await stop.wait()
        await cd.stop()
        return 0

    return runtime.run(_main)
