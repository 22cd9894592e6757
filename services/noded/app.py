"""noded: the node agent for node hardware faults (BMC over IPMI), shared storage, pingmesh and
FD-OL slow-node detection. This module is the wiring; the detection lives in the sources.

Source: issue 3, issue 12 (one source model, staged and budgeted shutdown), design.md "Processes" /
"Agent stream", reference noded.md §1–8.

One :class:`NodeD` per process. It owns the agent state and the agent stream to ClusterD
(:class:`faultmesh.agent.AgentClient`: snapshot on (re)connect, deltas with seq, at most one report
per ``--min-report-interval`` (5 s) under flapping, full re-send every ``--resend-every`` (30 min)),
the HTTP server (/metrics, /healthz, /readyz, /v1/node-info, /v1/state and the sources' routes), the
bounded blocking pool and the sources of :data:`noded.sources.SOURCES`, each started with its own
:class:`faultmesh.source.SourceContext`. A ControlMessage goes to the source that registered its
body kind (``ctx.on_control``).

Startup: sources (their routes and control kinds registered), HTTP, then — when a BMC is configured
and no ``--node-sn`` is given — up to ``--sn-wait`` s for the first BMC poll (the Hello carries the
node SN), then the agent stream.

Shutdown (:meth:`NodeD.stop`), within ``--stop-budget`` s in all (default 12 s, under the agents'
15 s grace): stop the sources (``--stop-sources-budget``, reverse order, overruns cancelled), drain
the agent stream (``--stop-drain-budget``), close HTTP, shut the pool down.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os

from faultmesh import config
from faultmesh.agent import (
    AgentClient,
    AgentState,
    add_clusterd_arguments,
    agent_options,
    channel_credentials,
)
from faultmesh.httplite import HttpServer, Request, Response, json_response
from faultmesh.log import add_log_arguments, event
from faultmesh.metrics import daemon_registry
from faultmesh.runtime import BlockingPool, Stage, StopBudget, staged_stop, wait_for
from faultmesh.source import SourceContext, SourceMetrics, start_sources, stop_sources
from noded import faultconfig, nodeinfo, sources
from noded.metrics import NodedMetrics
from noded.sinks import kube_nodeinfo
from noded.sources.bmc import SOURCE_OEM, SOURCE_SEL, Bmc

log = logging.getLogger("noded")


def build_parser(source_classes: tuple[type, ...] = sources.SOURCES) -> argparse.ArgumentParser:
    """The noded command line (core flags + each source's flags). Env ``FAULTMESH_<FLAG>`` and
    ``--config`` YAML work for every flag (faultmesh.config)."""
    p = argparse.ArgumentParser(prog="noded", description="faultmesh noded: node hardware faults via the BMC")
    p.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME"), help="this node's name (env NODE_NAME)"
    )
    add_clusterd_arguments(p)
    p.add_argument("--node-sn", help="the server's serial number (default: read from a Huawei iBMC)")
    p.add_argument(
        "--sn-wait",
        type=float,
        default=3.0,
        help="how long the agent stream waits at startup for the BMC to give the node SN (s)",
    )
    p.add_argument(
        "--http-addr", default="127.0.0.1:11255", help="HTTP address for /metrics /healthz /readyz"
    )
    p.add_argument("--node-info-file", help="also write the reference node-info document to this file")
    p.add_argument("--print-node-info", action="store_true", help="poll the BMC once, print node-info, exit")
    p.add_argument("--min-report-interval", type=float, default=5.0, help="at most one report per this (s)")
    p.add_argument("--resend-every", type=float, default=1800.0, help="re-send unchanged state every (s)")
    p.add_argument(
        "--blocking-workers", type=int, default=2, help="threads for blocking calls (pyghmi, DCMI)"
    )
    p.add_argument(
        "--stop-budget", type=float, default=12.0, help="the whole shutdown, at most (s; agents' grace is 15)"
    )
    p.add_argument("--stop-sources-budget", type=float, default=6.0, help="stopping the sources, at most (s)")
    p.add_argument(
        "--stop-drain-budget", type=float, default=2.0, help="sending pending changes at stop, at most (s)"
    )
    add_log_arguments(p)
    kube_nodeinfo.add_arguments(p)
    faultconfig.add_arguments(p)
    sources.add_arguments(p, source_classes)
    return p


class NodeD:
    """The noded process. Build with parsed ``args`` (and the source classes, default
    :data:`noded.sources.SOURCES`); ``await start()``; ``await stop()``.

    Raises ``ValueError`` (no node name, a BMC host without password, a bad SEL table) or ``OSError``
    (an unreadable configuration file) for a configuration it cannot run with.
    """

    def __init__(self, args: argparse.Namespace, source_classes: tuple[type, ...] = sources.SOURCES) -> None:
        if not args.node_name:
            raise ValueError("noded needs --node-name (or env NODE_NAME)")
        self.args = args
        self.node_name: str = args.node_name
        self.registry = daemon_registry("noded")
        self.metrics = NodedMetrics(self.registry)
        self.source_metrics = SourceMetrics(self.registry)
        self.state = AgentState(self.node_name)
        self.blocking = BlockingPool(max_workers=max(1, args.blocking_workers), name="noded-blocking")
        token = config.read_secret(args.token_file, what="--token-file") if args.token_file else None
        self.http = HttpServer(args.http_addr, self.registry, ready=self._ready, token=token)
        self.http.app.router.add_get("/v1/node-info", self._node_info_handler)
        self.http.app.router.add_get("/v1/state", self._state_handler)
        self.agent = AgentClient(
            args.clusterd,
            self.node_name,
            "noded",
            state=self.state,
            node_sn=args.node_sn or "",
            on_control=self.on_control,
            credentials=channel_credentials(args),
            token=token,
            registry=self.registry,
            min_report_interval_s=args.min_report_interval,
            resend_every_s=args.resend_every,
            **agent_options(args),
        )
        self.sources: list = []
        self._sections: dict[int, object] = {}  # id(source) -> its typed section
        for cls in source_classes:
            section = sources.config_section(args, cls)
            try:
                src = cls.from_config(section, self.metrics)
            except (ValueError, OSError):
                raise  # a configuration noded cannot run with
            except Exception as e:  # one broken source must not take noded down
                event(log, logging.ERROR, "source not started", source=cls.name, error=repr(e))
                continue
            self._sections[id(src)] = section
            self.sources.append(src)
        self.bmc: Bmc | None = next((s for s in self.sources if isinstance(s, Bmc)), None)
        if self.bmc is not None:
            self.bmc.on_serial = self._serial_read
        self.started: list[tuple[object, SourceContext]] = []
        self._controls: dict = {}
        self._last_doc_digest = ""
        self.kube_sink = (
            kube_nodeinfo.KubeNodeInfo(args, self.node_name, self.registry) if args.kube else None
        )
        self.fault_cm, self.fault_config = faultconfig.follower(args, getattr(self.bmc, "watcher", None))

    def make_ctx(self, src) -> SourceContext:
        """The context of one source: its section, this node's state, the pool, the registry."""
        return SourceContext(
            name=src.name,
            node=self.node_name,
            state=self.state,
            pool=self.blocking,
            config=self._sections.get(id(src)),
            registry=self.registry,
            metrics=self.source_metrics,
            node_ip=self.args.node_ip or "",
        )

    @property
    def bmc_configured(self) -> bool:
        """True when a BMC host is configured (the BMC source polls)."""
        return self.bmc is not None and self.bmc.client is not None

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sources, serve HTTP, wait (bounded) for the node SN, connect to ClusterD.
        Raises ``OSError`` when the HTTP address is taken."""
        if self.kube_sink is not None:
            await self.kube_sink.start()
        if self.fault_cm is not None:
            await self.fault_cm.start()
        if self.args.node_info_file or self.kube_sink is not None:
            self.state_hook()
        self.started = await start_sources(self.sources, self.make_ctx)
        for _src, ctx in self.started:
            for method, path, handler in ctx.routes:
                self.http.app.router.add_route(method, path, handler)
            self._controls.update(ctx.controls)
        await self.http.start()
        if self.bmc_configured and not self.agent.hello.node_sn:
            # the Hello carries the node SN (ClusterD maps public faults' nodeSN to nodes): give the
            # first BMC poll a moment to read it; a later read reaches ClusterD on the next reconnect
            with contextlib.suppress(TimeoutError):
                await wait_for(self.bmc.polled.wait(), self.args.sn_wait)
        await self.agent.start()
        event(
            log,
            logging.INFO,
            "noded started",
            node=self.node_name,
            clusterd=self.args.clusterd,
            bmc=f"{self.bmc.client.host}:{self.bmc.client.port}" if self.bmc_configured else "-",
            http=f"{self.http.host}:{self.http.port}",
            sources=",".join(self._source_label(src) for src, _ in self.started),
        )

    def _source_label(self, src) -> str:
        """A started source's name on the start line, with what it runs without: ``bmc(no host)``
        without ``--bmc-host``, ``pingmesh(hccs off)`` without an HCCS backend."""
        if src is self.bmc and not self.bmc_configured:
            return f"{src.name}(no host)"
        if getattr(src, "backend_name", None) == "off":
            return f"{src.name}(hccs off)"
        return src.name

    async def stop(self) -> None:
        """Staged stop within ``--stop-budget`` s: sources, agent drain, HTTP, pool (module doc)."""
        a = self.args
        started, self.started = self.started, []
        stages: list[Stage] = [
            # stop_sources keeps its own budget (t - 1 s): the stage's bound is only a backstop
            ("sources", lambda t: stop_sources(started, max(0.1, t - 1.0)), a.stop_sources_budget + 1.0),
            ("agent", lambda t: self.agent.stop(drain_s=max(0.1, t - 1.0)), a.stop_drain_budget + 1.0),
            ("http", lambda t: self.http.stop(), a.stop_budget),
        ]
        if self.kube_sink is not None:
            stages.append(("kube", lambda t: self.kube_sink.stop(max(0.1, t - 1.0)), 3.0))
        if self.fault_cm is not None:
            stages.append(("kube-fault-config", lambda t: self.fault_cm.stop(), 3.0))
        await staged_stop("noded", stages, StopBudget(a.stop_budget), log)
        self.blocking.shutdown()
        event(log, logging.INFO, "noded stopped", node=self.node_name)

    # -- control messages ------------------------------------------------------------------------
    async def on_control(self, msg) -> None:
        """Route a ControlMessage to the source handling its body kind. Raises ``LookupError``
        for a kind nobody handles (the agent client acks it with that error)."""
        kind = msg.WhichOneof("body")
        handler = self._controls.get(kind or "")
        if handler is None:
            event(log, logging.WARNING, "control message unhandled", kind=kind, seq=msg.seq)
            raise LookupError(f"no noded source handles control kind {kind!r}")
        await handler(msg)

    # -- node-info ---------------------------------------------------------------------------------
    def bmc_faults(self):
        """The BMC faults in the order they were reported."""
        return [f for k, f in self.state.faults.items() if k.source in (SOURCE_OEM, SOURCE_SEL)]

    def node_info(self) -> dict:
        """The reference ``FaultDevInfo`` object for this node (noded.md §4)."""
        return nodeinfo.fault_dev_info(self.bmc_faults())

    def state_hook(self) -> None:
        """Write ``--node-info-file`` and offer the ``--kube`` ConfigMap when the node-info content
        changed (hooked to state changes)."""
        if not self.args.node_info_file and self.kube_sink is None:
            return
        orig = self.state.on_change

        def hooked() -> None:
            orig()
            self._write_node_info()

        if not getattr(self.state.on_change, "_noded_hook", False):
            hooked._noded_hook = True  # type: ignore[attr-defined]
            self.state.on_change = hooked
        self._write_node_info()

    def _write_node_info(self) -> None:
        info = self.node_info()
        digest = nodeinfo.go_json(info)
        if digest == self._last_doc_digest:
            return
        if self.kube_sink is not None:
            self.kube_sink.update(info)
        if not self.args.node_info_file:
            self._last_doc_digest = digest
            return
        try:
            nodeinfo.write_document(self.args.node_info_file, info)
            self._last_doc_digest = digest
        except OSError as e:
            event(log, logging.WARNING, "node-info write failed", path=self.args.node_info_file, error=str(e))

    # -- hooks -------------------------------------------------------------------------------------
    def _serial_read(self, sn: str) -> None:
        if not self.agent.hello.node_sn:
            self.agent.hello.node_sn = sn

    def _ready(self) -> tuple[bool, str]:
        parts = [self.agent.readiness()]  # clusterd=up, or clusterd=down (why)
        if self.bmc is not None and self.bmc_configured:
            parts.append(
                "bmc="
                + (
                    "ok"
                    if self.bmc.failures == 0 and self.bmc.polls_ok
                    else (self.bmc.last_error or "pending")
                )
            )
        return True, " ".join(parts)

    async def _node_info_handler(self, request: Request) -> Response:
        info = self.node_info()
        return json_response({"NodeInfo": info, "CheckCode": nodeinfo.check_code(info)})

    async def _state_handler(self, request: Request) -> Response:
        return json_response(
            {
                "node": self.node_name,
                "node_status": self.state.node_status,
                "faults": [
                    {
                        "source": f.source,
                        "device_type": f.device_type,
                        "device_id": f.device_id,
                        "code": f.code,
                        "level": f.level,
                        "first_seen_ms": f.first_seen_ms,
                        "attributes": f.attributes,
                    }
                    for f in self.state.faults.values()
                ],
                "conditions": {
                    t: {"active": c.active, "reason": c.reason, "message": c.message}
                    for t, c in self.state.conditions.items()
                },
                "bmc_mode": self.bmc.mode if self.bmc is not None and self.bmc_configured else None,
                "clusterd_connected": self.agent.connected.is_set(),
            }
        )
