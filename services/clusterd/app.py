"""ClusterD: the cluster brain (issue 2; design.md "Processes"), wired explicitly (issue 12).

``clusterd --grpc-addr 127.0.0.1:8899 --http-addr 127.0.0.1:8080 --state-dir DIR`` (the defaults;
``--state-dir`` defaults to ``$XDG_STATE_HOME/faultmesh/clusterd``). Every flag also reads
``FAULTMESH_<FLAG>`` and a YAML ``--config``.

Wiring: :class:`ClusterD` builds each component's typed configuration section once (:data:`SECTIONS`),
the replica's Lease :class:`~clusterd.kube.leader.Election` and the follower gate over it, one frozen
:class:`~clusterd.context.ClusterContext` (store, fault center, node registry, agent hub, tasks, HTTP,
metrics, auth, config) and the components with it plus their section and the peers each needs, in
this order: PubFault, Kubernetes mode (gets the PubFault intake, the brain's job registry, the
manual-separation policy intake and the election), brain, manual separation
(:mod:`clusterd.separation`), slow node (gets the job registry and the brain's data-trace hook),
slow net (gets the election and the Kubernetes watch metrics), the Kubernetes control ConfigMaps
(:class:`~clusterd.kube.control.ControlMaps`, with the Kubernetes and slow-node components, the
brain's data trace and the slow-net topology; started after them), operator acknowledgements,
relation rules per job, history. Start order: state file -> fault center and node registry
(restored) -> components -> HTTP -> gRPC.

Shutdown is staged, each stage with a budget from the command line, in all at most
``--shutdown-budget-s`` (25 s: inside the chart's 30 s termination grace):

1. stop accepting: not ready, gRPC health NOT_SERVING, the gRPC server stops with ``--drain-s``
   grace for open streams;
2. stop components (``--component-stop-s`` shared by all);
3. drain the fault-center subscribers (``--sink-drain-s``) and the final write of the node registry;
4. close: HTTP, the remaining tasks (``--task-stop-s``) and the state file.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import logging
import os
import sqlite3
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health
from prometheus_client import Counter, Gauge

from clusterd import breaker
from clusterd.acks import AckBook
from clusterd.api.grpcserver import (
    DecodeGuardInterceptor,
    RateLimitInterceptor,
    add_health_and_reflection,
    bind_grpc,
    mark_serving,
    server_options,
)
from clusterd.api.pubfault import PubFaultComponent, PubFaultConfig
from clusterd.auth import PROTECTED, TokenAuth
from clusterd.brain.component import BrainComponent
from clusterd.brain.decisions import DecisionLog
from clusterd.brain.jobs import JobRegistry
from clusterd.breaker import IsolationBreaker
from clusterd.center import FaultCenter
from clusterd.context import ClusterContext, Metrics
from clusterd.coreconfig import CoreConfig
from clusterd.faultseries import FaultSeriesCollector
from clusterd.history import HistoryComponent, HistoryConfig
from clusterd.http.jobview import JobView
from clusterd.http.nodes import NodeApi
from clusterd.http.nodeview import NodeView
from clusterd.http.statewrite import state_write_middleware
from clusterd.http.web import WebUi
from clusterd.ingest.agents import AgentHub
from clusterd.kube import KubeComponent
from clusterd.kube import ha as kha
from clusterd.kube.cmchecks import ConfigMapChecks
from clusterd.kube.config import KubeConfig
from clusterd.kube.control import ControlConfig, ControlMaps
from clusterd.kube.faultjobinfo import slownet_topology
from clusterd.kube.gate import FollowerGate
from clusterd.kube.handoff import PodGroupPlatform
from clusterd.kube.leader import Election
from clusterd.nodehealth import NodeHealthCollector
from clusterd.nodes import NodeRegistry
from clusterd.relations import RelationComponent, RelationConfig
from clusterd.separation import ManualSeparation, SeparationConfig
from clusterd.slownet.component import SlowNetComponent
from clusterd.slownet.state import SlowNetConfig
from clusterd.slownode.component import SlowNodeComponent, SlowNodeConfig
from clusterd.slownode.kube import SlowNodeConfigMaps
from clusterd.store import Store
from faultmesh import config, runtime
from faultmesh import log as fmlog
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.httpd import HttpServer
from faultmesh.lease import LeaseElector
from faultmesh.log import event
from faultmesh.metrics import daemon_registry
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd")

COMPONENT_CLASSES: tuple[type, ...] = (
    PubFaultComponent, KubeComponent, BrainComponent, ManualSeparation, SlowNodeComponent, SlowNetComponent,
    RelationComponent, HistoryComponent,
)  # fmt: skip
"""Every component class, in start order (their flags join the command line)."""

SECTIONS: tuple[type, ...] = (
    CoreConfig, PubFaultConfig, KubeConfig, SeparationConfig, SlowNodeConfig, SlowNetConfig, ControlConfig,
    RelationConfig, HistoryConfig,
)  # fmt: skip
"""The typed configuration sections :class:`ClusterD` builds from the parsed command line, one per
component (:func:`faultmesh.config.section`); each is checked against :func:`build_parser`."""


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/faultmesh/clusterd`` (``~/.local/state/...`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "faultmesh", "clusterd")


def component_classes() -> list[type]:
    """:data:`COMPONENT_CLASSES` as a list (what :func:`build_parser` takes)."""
    return list(COMPONENT_CLASSES)


_load_component_classes = component_classes  # the name tests and the chart check use


def build_parser(classes: list[type] | None = None) -> argparse.ArgumentParser:
    """The clusterd command line (core flags + every component's flags)."""
    p = argparse.ArgumentParser(prog="clusterd", description="faultmesh ClusterD: the cluster brain")
    p.add_argument("--grpc-addr", default="127.0.0.1:8899", help="gRPC listen address (host:port)")
    p.add_argument("--http-addr", default="127.0.0.1:8080", help="HTTP listen address for /metrics, /v1/...")
    p.add_argument("--state-dir", default=default_state_dir(), help="folder of the SQLite state file")
    p.add_argument("--fsync-full", action="store_true", help="fsync every commit (survives power loss)")
    p.add_argument(
        "--state-busy-timeout-ms",
        type=int,
        default=5000,
        help="how long a state write waits for another holder of the SQLite write lock before it fails",
    )
    p.add_argument("--tls-cert", help="PEM server certificate: enables TLS on gRPC")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--tls-ca", help="PEM CA: clients must present a certificate it signed (mTLS)")
    breaker.add_arguments(p)
    p.add_argument("--token-file", help="bearer token that mutating RPCs and agents must send")
    p.add_argument(
        "--token-scope",
        choices=("all", "agents"),
        default="all",
        help="gRPC methods that need --token-file's token: all mutating ones, or only the agent stream "
        "and PubFault (the reference's TaskD/MindIO/platform clients send no token); HTTP writes always",
    )
    p.add_argument("--drain-s", type=float, default=5.0, help="grace period for streams on shutdown (s)")
    p.add_argument(
        "--component-stop-s", type=float, default=10.0, help="shutdown: budget of all component stops (s)"
    )
    p.add_argument(
        "--sink-drain-s", type=float, default=3.0, help="shutdown: fault subscribers catch up within (s)"
    )
    p.add_argument("--task-stop-s", type=float, default=3.0, help="shutdown: remaining tasks end within (s)")
    p.add_argument(
        "--shutdown-budget-s",
        type=float,
        default=25.0,
        help="shutdown: all stages together (s); keep under the pod's termination grace (30 s)",
    )
    p.add_argument(
        "--unary-qps", type=config.positive_float, default=1000.0, help="shared unary token bucket (req/s)"
    )
    p.add_argument(
        "--max-connections", type=config.positive_int, default=1024, help="gRPC connections accepted at once"
    )
    p.add_argument("--grpc-keepalive-s", type=float, default=60.0, help="gRPC keepalive ping period (s)")
    p.add_argument(
        "--grpc-keepalive-timeout-s", type=float, default=5.0, help="gRPC keepalive ack timeout (s)"
    )
    p.add_argument(
        "--agent-stale-after-s",
        type=float,
        default=30.0,
        help="an agent stream silent this long (no message, not even its heartbeat) is marked stale (s)",
    )
    p.add_argument(
        "--agent-expire-after-s",
        type=float,
        default=86400.0,
        help="an agent without a stream this long is dropped from the node views with its faults (s)",
    )
    fmlog.add_log_arguments(p)
    for cls in COMPONENT_CLASSES if classes is None else classes:
        cls.add_arguments(p)
    return p


class ClusterD:
    """One ClusterD process (see the module docstring).

    ``ctx`` is the cluster context; ``components`` the started components in order; ``brain``,
    ``jobs``, ``pubfault`` the peers wired here. ``center``, ``store``, ``nodes``, ``agents``,
    ``http``, ``registry``, ``rejected`` are the context's parts (read-only shortcuts); ``core``:
    ClusterD's own section (:class:`~clusterd.coreconfig.CoreConfig`). Each component gets its typed
    section (:data:`SECTIONS`), built once here; the whole ``args`` stays in the context for the brain.
    ``classes`` is accepted for the command-line's sake and must be :data:`COMPONENT_CLASSES`.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        classes: list[type] | None = None,
        *,
        store: Store | None = None,
        elector: LeaseElector | None = None,
    ) -> None:
        core = self.core = config.section(CoreConfig, args)  # the sections, built once
        kube_cfg = config.section(KubeConfig, args)
        registry = daemon_registry("clusterd")
        rejected = Counter("faultmesh_rejected_requests_total", "Rejected requests by service and reason",
                           ["service", "reason"], registry=registry)  # fmt: skip
        self.up = Gauge("faultmesh_clusterd_ready", "1 when ClusterD serves", registry=registry)
        store = store or Store(
            core.state_dir, fsync_full=core.fsync_full, busy_timeout_ms=core.state_busy_timeout_ms
        )  # HA (clusterd.kube.ha): a MirroredStore, and the replica's Lease elector
        center = FaultCenter(store, registry)
        nodes = NodeRegistry(store, center, registry=registry)
        node_health = NodeHealthCollector(nodes, center)
        registry.register(node_health)
        fault_series = FaultSeriesCollector(center)  # issue 31: per-fault series, text read at scrape
        self._ready = False
        election = Election(elector)  # the elector: given (HA), or the Kubernetes component's own
        self.gate = gate = FollowerGate(election, lambda s, r: rejected.labels(s, r).inc())
        http = HttpServer(
            core.http_addr,
            registry,
            ready=lambda: gate.ready(self._ready, "ready" if self._ready else "starting"),
            rejected=rejected,
            metrics=lambda: node_health.exposition(registry) + fault_series.text() + self.acks.series_text(),
        )
        auth = TokenAuth.from_file(core.token_file, rejected, core.token_scope)
        http.app.middlewares.append(self.gate.http_middleware())  # followers refuse (issue 15 HA)
        http.app.middlewares.append(auth.http_middleware())
        http.app.middlewares.append(state_write_middleware(center.store_errors))  # 503, counted
        self.ctx = ClusterContext(
            config=args,
            store=store,
            center=center,
            nodes=nodes,
            agents=AgentHub(center, nodes, registry, rejected, stale_after_s=core.agent_stale_after_s,
                            expire_after_s=core.agent_expire_after_s),
            tasks=runtime.TaskOwner("clusterd"),
            http=http,
            metrics=Metrics(registry, rejected),
            auth=auth,
        )  # fmt: skip
        self.acks = AckBook(self.ctx)  # issue 31: operator acknowledgements (stored, shown, expiring)
        self.acks.add_routes(http.app.router)
        node_api = NodeApi(center, nodes, self.ctx.agents, self.acks.ack_of)
        node_api.add_routes(http.app.router)
        (web_ui := WebUi(center, nodes, self.ctx.agents, self.acks.ack_of)).add_routes(http.app)
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        ctx = self.ctx
        self.pubfault = PubFaultComponent(ctx, config.section(PubFaultConfig, args))
        self.breaker = IsolationBreaker(
            core.isolation_max_share, core.isolation_window_s, lambda: len(nodes.names()), registry,
            token_name=auth.token_name, store=store,
        )  # fmt: skip
        self.breaker.add_routes(http.app.router)
        self.separation = ManualSeparation(ctx, config.section(SeparationConfig, args), self.breaker)
        self.separation.add_routes(http.app.router)
        jobs = JobRegistry(ctx.store)
        NodeView(node_api, ctx.store, jobs.jobs_on_node).add_routes(http.app.router)  # the web's node page
        decisions = DecisionLog(ctx.store, registry, ctx.tasks.spawn)
        reports: list = []  # the brain's ReportProcessFault listeners (the Kubernetes hand-off)
        kube = KubeComponent(
            ctx,
            kube_cfg,
            public_faults=self.pubfault.intake,
            jobs=jobs,
            policy=self.separation.set_policy_text,
            decisions=decisions.subscribe,
            reports=reports.append,
            election=election,
            breaker=self.breaker,
        )
        podgroups = kube.enabled and kube.handoff is not None and kube_cfg.kube_podgroups == "on"
        platform = PodGroupPlatform(kube.handoff) if podgroups else None  # platform mode on PodGroups
        self.brain = brain = BrainComponent(ctx, jobs, decisions, reports, platform, kube.pod_port)
        self.jobs = jobs
        slownode = SlowNodeComponent(
            ctx,
            config.section(SlowNodeConfig, args),
            jobs=jobs,
            set_data_trace=brain.set_data_trace,
            data_trace_root=brain.datatrace.root,
        )
        JobView(brain.jobs_http.page, web_ui.grid, slownode.status).add_routes(http.app.router)  # issue 31
        slownet = SlowNetComponent(  # the election gates slownet's ConfigMap writes
            ctx, config.section(SlowNetConfig, args), kube_cfg, election, kube.metrics
        )
        kube.superpods.pingmesh_on = lambda: any(a.activate for a in slownet.config.values())
        control_cfg, checks = config.section(ControlConfig, args), ConfigMapChecks(kube.metrics)
        control = ControlMaps(  # the control ConfigMaps and fault-job-info: started after kube and slownode
            control_cfg, kube, jobs, ctx.store, checks, ctx.tasks.spawn,
            slownode=SlowNodeConfigMaps(slownode, checks, control_cfg.kube_slownode_namespace),
            data_trace=brain.datatrace, topology=slownet_topology(slownet),
        )  # fmt: skip
        if kube.enabled:
            decisions.subscribe(control.on_decision)
        self.components = [
            self.pubfault, kube, self.brain, self.separation, slownode, slownet, control, self.acks,
            RelationComponent(ctx, config.section(RelationConfig, args), jobs.all),  # per job (issue 32)
            HistoryComponent(ctx, config.section(HistoryConfig, args)),
        ]  # fmt: skip
        self.grpc_port = 0
        self._server: grpc.aio.Server | None = None

    # -- read-only shortcuts to the context -------------------------------------------------------
    store = property(lambda self: self.ctx.store)
    center = property(lambda self: self.ctx.center)
    nodes = property(lambda self: self.ctx.nodes)
    agents = property(lambda self: self.ctx.agents)
    tasks = property(lambda self: self.ctx.tasks)
    http = property(lambda self: self.ctx.http)
    registry = property(lambda self: self.ctx.metrics.registry)
    rejected = property(lambda self: self.ctx.metrics.rejected)

    def _servicers(self) -> list[tuple]:
        out: list[tuple] = [(agent_pb2_grpc.add_AgentStreamServicer_to_server, self.ctx.agents)]
        for c in self.components:
            out.extend(c.servicers() if hasattr(c, "servicers") else ())
        return out

    async def start(self) -> None:
        """Open state, restore faults and nodes, start components, HTTP, then gRPC.
        Raises ``OSError`` on bind (or a component's start error)."""
        ctx, core = self.ctx, self.core
        await ctx.store.open()
        n = await ctx.center.load()
        await ctx.nodes.load()
        ctx.tasks.spawn(ctx.center.run(), name="fault-center-writer")
        ctx.tasks.spawn(ctx.nodes.run(), name="node-registry-writer")
        ctx.tasks.spawn(ctx.agents.watch_liveness(), name="agent-liveness")
        ctx.center.start_sinks(ctx.tasks.spawn)
        for c in self.components:
            await c.start()
        await ctx.http.start()
        server = grpc.aio.server(
            options=server_options(
                core.max_connections, core.grpc_keepalive_s, core.grpc_keepalive_timeout_s
            ),
            interceptors=[
                self.gate.interceptor(),
                DecodeGuardInterceptor(ctx.metrics.rejected, PROTECTED),
                RateLimitInterceptor(ctx.metrics.rejected, unary_rate=core.unary_qps),
                ctx.auth.interceptor(),
            ],
        )
        servicers = self._servicers()
        for add_fn, servicer in servicers:
            add_fn(servicer, server)
        names = [agent_pb2.DESCRIPTOR.services_by_name["AgentStream"].full_name]
        for _, servicer in servicers:
            for base in type(servicer).__mro__:
                if base.__name__.endswith("Servicer") and base.__module__.startswith("faultmesh._pb"):
                    mod = importlib.import_module(base.__module__.replace("_grpc", ""))
                    names.extend(s.full_name for s in mod.DESCRIPTOR.services_by_name.values())
        self._served = add_health_and_reflection(server, self.health, names)
        self.grpc_port = bind_grpc(server, core.grpc_addr, core.tls_cert, core.tls_key, core.tls_ca)
        await server.start()
        self._server = server
        await mark_serving(self.health, self._served)
        self._ready = True
        self.up.set(1)
        event(
            log,
            logging.INFO,
            "clusterd started",
            grpc=core.grpc_addr,
            grpc_port=self.grpc_port,
            http=f"{ctx.http.host}:{ctx.http.port}",
            state=ctx.store.path,
            faults_restored=n,
            tls=bool(core.tls_cert),
            components=",".join(c.name for c in self.components),
        )

    async def stop(self) -> None:
        """Staged shutdown within ``--shutdown-budget-s`` (see the module docstring)."""
        ctx, core = self.ctx, self.core
        t0 = time.monotonic()
        budget = runtime.StopBudget(core.shutdown_budget_s)  # the agents' staged_stop budget too
        self._ready = False
        self.up.set(0)
        # 1. stop accepting
        if self._server is not None:
            await self.health.enter_graceful_shutdown()
            grace = budget.take(core.drain_s)
            try:
                await wait_for(self._server.stop(grace), grace + 1.0)
            except TimeoutError:
                event(log, logging.WARNING, "grpc server stop timed out", grace_s=grace)
        # 2. stop components (one shared budget, in reverse start order)
        stop_by = time.monotonic() + budget.take(core.component_stop_s)
        for c in reversed(self.components):
            try:
                await wait_for(c.stop(), max(0.1, stop_by - time.monotonic()))
            except Exception as e:
                event(log, logging.ERROR, "component stop failed", component=c.name, error=repr(e))
        # 3. drain the subscribers, final write
        await ctx.center.drain_sinks(budget.take(core.sink_drain_s))
        await ctx.center.stop_sinks()
        if ctx.store.is_open:
            try:
                await wait_for(ctx.nodes.flush(), max(0.1, budget.take(core.sink_drain_s)))
            except Exception as e:
                event(log, logging.ERROR, "node state write failed", error=repr(e))
        # 4. close
        await ctx.http.stop()
        await ctx.tasks.close(max(0.1, budget.take(core.task_stop_s)))
        await ctx.store.close()
        event(log, logging.INFO, "clusterd stopped", took_s=round(time.monotonic() - t0, 2))


def start_error(e: Exception, args) -> str:
    """One line for a start-up failure: the state database's errors name ``--state-dir``; others
    keep their text (a file or port named by a flag), with the exception's type when not OSError."""
    if isinstance(e, sqlite3.Error):
        return f"--state-dir {args.state_dir}: state database: {e}"
    return str(e) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"


GC_THRESHOLDS = (20_000, 20, 100)
"""clusterd's cyclic-GC thresholds (CPython's defaults: 700, 10, 10). With the default, a clusterd
holding 1000 agents' faults ran a full (generation 2) collection every ~2 s of ingest, each 300-450 ms
with the loop stopped: the ack p99 at half rate was those pauses (bench/ingest.py, 1000 agents x
10 upserts: p99 326 -> 49 ms and 15.6k -> 21.7k deltas per server core-second, same box, same hour).
Garbage is freed by reference counting as before; only cycles wait longer."""


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLDS` for this process (the daemon only; not for in-process tests)."""
    gc.set_threshold(*GC_THRESHOLDS)


def check_tls_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage error (exit 2, naming the missing flag) unless ``--tls-cert`` and ``--tls-key`` come
    together; ``--tls-ca`` (mTLS) needs them. Without this a lone ``--tls-cert`` failed at bind with
    a TypeError (exit 1) and a lone ``--tls-key`` / ``--tls-ca`` served plaintext."""
    config.check_tls_pair(parser, args, "the PEM server certificate")  # as the agents' client pair
    if args.tls_ca and not args.tls_cert:
        parser.error("--tls-ca (client certificates, mTLS) needs --tls-cert and --tls-key")


def main(argv: list[str] | None = None) -> int:
    """Console script ``clusterd``."""
    parser = build_parser()
    args = config.parse(parser, argv)
    check_tls_flags(parser, args)
    fmlog.setup_from_args(args)
    try:
        Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        event(log, logging.ERROR, "clusterd failed to start", error=f"--state-dir {args.state_dir}: {e}")
        return 1

    tune_gc()
    kube = config.section(KubeConfig, args)
    if kube.replicated:  # one of several replicas: follower until it holds the Lease
        core = config.section(CoreConfig, args)
        return runtime.run(
            lambda stop: kha.run_replica(
                core, kube, lambda st, el: ClusterD(args, store=st, elector=el), stop
            )
        )

    async def _main(stop: asyncio.Event) -> int:
        try:
            cd = ClusterD(args)
        except Exception as e:  # an unreadable token / TLS / table file named by a flag
            event(log, logging.ERROR, "clusterd failed to start", error=start_error(e, args))
            return 1
        try:
            await cd.start()
        except Exception as e:  # the state database, a port, a table: one line, not a traceback
            event(log, logging.ERROR, "clusterd failed to start", error=start_error(e, args))
            await cd.stop()
            return 1
        gc.freeze()  # the restored state and the loaded code: never scanned by the cyclic GC again
        await stop.wait()
        await cd.stop()
        return 0

    return runtime.run(_main)
