"""noded: the node agent for node hardware faults (BMC over IPMI), storage monitors and components.

Source: issue 3, design.md "Processes" / "Agent stream", reference noded.md §1–5, §7–8.

One :class:`NodeD` per process. It owns the agent state and the agent stream to ClusterD
(:class:`faultmesh.agent.AgentClient`: snapshot on (re)connect, deltas with seq, at most one report
per ``--min-report-interval`` (5 s) under flapping, full re-send every ``--resend-every`` (30 min)),
the BMC monitor, the DPC/DTFS monitors, the level table watcher, the HTTP server (/metrics,
/healthz, /readyz, /v1/node-info) and the components of :mod:`noded.components`. Control
messages from ClusterD go to the component whose ``control_kinds`` lists the message's body kind.

The app object gives components: ``args``, ``node_name``, ``state``, ``agent``, ``registry``,
``http``, ``tasks``, ``blocking`` (BlockingPool), ``metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from faultmesh import config
from faultmesh.agent import AgentClient, AgentState, add_clusterd_arguments, channel_credentials
from faultmesh.httpd import HttpServer, json_response
from faultmesh.log import event
from faultmesh.runtime import BlockingPool, TaskOwner
from noded import nodeinfo
from noded.bmc.client import BmcClient
from noded.bmc.sel import SelEventTable, SelTableError
from noded.components import COMPONENTS
from noded.levels import LevelTable, LevelTableWatcher
from noded.metrics import NodedMetrics
from noded.sources.bmc import SOURCE_OEM, SOURCE_SEL, BmcMonitor
from noded.sources.storage import StorageMonitor

log = logging.getLogger("noded")

DEFAULT_SEL_TABLE = "sel_events.json"


def load_component_classes(names: tuple[str, ...] = COMPONENTS) -> tuple[list[type], list[tuple[str, str]]]:
    """Import every ``"module:Class"`` in ``names``. Returns (classes, missing) where ``missing`` is
    [(spec, error)] for components that are not importable (logged by the caller; noded runs on)."""
    classes: list[type] = []
    missing: list[tuple[str, str]] = []
    for spec in names:
        mod, _, cls = spec.partition(":")
        try:
            classes.append(getattr(importlib.import_module(mod), cls))
        except Exception as e:  # missing module, missing class, or a broken component: skip it
            missing.append((spec, repr(e)))
    return classes, missing


def _interval(lo: float, hi: float):
    def parse(v: str) -> float:
        x = float(v)
        if not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"must be within {lo:g}..{hi:g}")
        return x

    return parse


def build_parser(component_classes: list[type]) -> argparse.ArgumentParser:
    """The noded command line (core flags + each component's flags). Env ``FAULTMESH_<FLAG>`` and
    ``--config`` YAML work for every flag (faultmesh.config)."""
    p = argparse.ArgumentParser(prog="noded", description="faultmesh noded: node hardware faults via the BMC")
    p.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME"), help="this node's name (env NODE_NAME)"
    )
    add_clusterd_arguments(p)
    p.add_argument("--bmc-host", help="BMC address; empty: run without a BMC")
    p.add_argument("--node-sn", help="the server's serial number (default: read from a Huawei iBMC)")
    p.add_argument(
        "--sn-wait",
        type=float,
        default=3.0,
        help="how long the agent stream waits at startup for the BMC to give the node SN (s)",
    )
    p.add_argument("--bmc-port", type=int, default=623, help="BMC IPMI UDP port")
    p.add_argument("--bmc-user", default="admin")
    p.add_argument("--bmc-password-file", help="file with the BMC password (else env FAULTMESH_BMC_PASSWORD)")
    p.add_argument(
        "--bmc-mode",
        choices=("auto", "oem", "sel"),
        default="auto",
        help="auto: Huawei iBMC OEM alarms when the BMC is Huawei, else the SEL",
    )
    p.add_argument(
        "--bmc-timeout", type=_interval(0.5, 600), default=15.0, help="timeout of one BMC poll (s)"
    )
    p.add_argument(
        "--poll-interval", type=_interval(1, 600), default=60.0, help="BMC poll period (s), 1..600"
    )
    p.add_argument(
        "--backoff-base", type=float, default=1.0, help="first retry delay after a BMC failure (s)"
    )
    p.add_argument(
        "--levels-file", help="fault level table in NodeDConfiguration.json format (reloaded on change)"
    )
    p.add_argument(
        "--levels-check-interval", type=float, default=5.0, help="how often to look for a new table (s)"
    )
    p.add_argument("--sel-events-file", help="SEL event -> fault table (JSON), default: noded's own")
    p.add_argument(
        "--dpc-status-file", help="DPC status file, e.g. /user/mind-cluster/dpcstatus/dpc_status_check"
    )
    p.add_argument(
        "--dtfs-status-file", help="DTFS status file, e.g. /user/mind-cluster/dtfsstatus/dtfs_status_check"
    )
    p.add_argument("--storage-interval", type=float, default=5.0, help="DPC/DTFS poll period (s)")
    p.add_argument(
        "--http-addr", default="127.0.0.1:11255", help="HTTP address for /metrics /healthz /readyz"
    )
    p.add_argument("--node-info-file", help="also write the reference node-info document to this file")
    p.add_argument("--print-node-info", action="store_true", help="poll the BMC once, print node-info, exit")
    p.add_argument("--min-report-interval", type=float, default=5.0, help="at most one report per this (s)")
    p.add_argument("--resend-every", type=float, default=1800.0, help="re-send unchanged state every (s)")
    p.add_argument(
        "--clusterd-backoff-max", type=float, default=10.0, help="longest wait between reconnects (s)"
    )
    p.add_argument(
        "--blocking-workers", type=int, default=2, help="threads for blocking calls (pyghmi, DCMI)"
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-file", help="also log to this file (rotated at 20 MiB)")
    for cls in component_classes:
        try:
            cls.add_arguments(p)
        except Exception as e:  # a component must not break noded's command line
            event(
                log,
                logging.ERROR,
                "component flags not added",
                component=getattr(cls, "name", cls),
                error=repr(e),
            )
    return p


def read_password(args: argparse.Namespace) -> str:
    """The BMC password from ``--bmc-password-file`` or env ``FAULTMESH_BMC_PASSWORD``. Raises
    ``ValueError`` without it (the value itself is never logged)."""
    pw = config.read_secret(args.bmc_password_file, "FAULTMESH_BMC_PASSWORD")
    if not pw:
        raise ValueError("a BMC host needs --bmc-password-file or env FAULTMESH_BMC_PASSWORD")
    return pw


class NodeD:
    """The noded process. Build with parsed ``args``; ``await start()``; ``await stop()``."""

    def __init__(self, args: argparse.Namespace, component_classes: list[type] | None = None) -> None:
        if not args.node_name:
            raise ValueError("noded needs --node-name (or env NODE_NAME)")
        self.args = args
        self.node_name: str = args.node_name
        self.registry = CollectorRegistry()
        self.metrics = NodedMetrics(self.registry)
        self.state = AgentState(self.node_name)
        self.tasks = TaskOwner("noded")
        self.blocking = BlockingPool(max_workers=max(1, args.blocking_workers), name="noded-blocking")
        self.http = HttpServer(args.http_addr, self.registry, ready=self._ready)
        self.http.app.router.add_get("/v1/node-info", self._node_info_handler)
        self.http.app.router.add_get("/v1/state", self._state_handler)
        token = config.read_secret(args.token_file) if args.token_file else None
        self.agent = AgentClient(
            args.clusterd,
            self.node_name,
            "noded",
            state=self.state,
            node_ip=os.environ.get("XDL_IP", ""),
            node_sn=args.node_sn or "",
            on_control=self.on_control,
            credentials=channel_credentials(args),
            token=token,
            registry=self.registry,
            min_report_interval_s=args.min_report_interval,
            resend_every_s=args.resend_every,
            backoff_max_s=args.clusterd_backoff_max,
        )
        self.levels = LevelTableWatcher(
            args.levels_file,
            on_change=self._levels_changed,
            on_reject=lambda r: self.metrics.level_reloads.labels(r).inc(),
        )
        self.bmc: BmcMonitor | None = None
        if args.bmc_host:
            client = BmcClient(
                args.bmc_host,
                args.bmc_port,
                args.bmc_user,
                read_password(args),
                timeout_s=min(5.0, args.bmc_timeout),
            )
            self.bmc = BmcMonitor(
                state=self.state,
                client=client,
                pool=self.blocking,
                levels=lambda: self.levels.table,
                sel_table=self._sel_table(),
                metrics=self.metrics,
                poll_interval_s=args.poll_interval,
                timeout_s=args.bmc_timeout,
                mode=args.bmc_mode,
                backoff_base_s=args.backoff_base,
            )
            self.bmc.on_serial = self._serial_read
        self.storage = [
            StorageMonitor(kind, path, self.state, self.metrics, interval_s=args.storage_interval)
            for kind, path in (("dpc", args.dpc_status_file), ("dtfs", args.dtfs_status_file))
            if path
        ]
        self.components: list = []
        self._routes: dict[str, object] = {}
        for cls in component_classes or []:
            try:
                comp = cls(self)
            except Exception as e:  # one broken component must not take noded down
                event(
                    log,
                    logging.ERROR,
                    "component not started",
                    component=getattr(cls, "name", cls),
                    error=repr(e),
                )
                continue
            self.components.append(comp)
            for kind in getattr(comp, "control_kinds", ()):
                self._routes[kind] = comp
        self._last_doc_digest = ""

    def _sel_table(self) -> SelEventTable:
        if self.args.sel_events_file:
            raw = Path(self.args.sel_events_file).read_bytes()
        else:
            from importlib import resources

            raw = resources.files("noded").joinpath(DEFAULT_SEL_TABLE).read_bytes()
        try:
            return SelEventTable.from_json(raw)
        except SelTableError as e:
            raise ValueError(f"SEL event table: {e}") from None

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve HTTP, connect to ClusterD, start monitors and components. Raises ``OSError`` when
        the HTTP address is taken."""
        await self.http.start()
        if self.bmc is not None:
            self.bmc.publish()  # the node status is reported even before the first poll
            self.tasks.spawn(self.bmc.run(), name="bmc-poll")
        else:
            self.state.set_node_status("Healthy")
            self.state.set_condition("BMCUnreachable", True, "NotConfigured", "noded runs without --bmc-host")
        for m in self.storage:
            self.tasks.spawn(m.run(), name=f"storage-{m.kind}")
        self.tasks.spawn(self.levels.run(self.args.levels_check_interval), name="levels-watch")
        if self.args.node_info_file:
            self.state_hook()
        if self.bmc is not None and not self.agent.hello.node_sn:
            # the Hello carries the node SN (ClusterD maps public faults' nodeSN to nodes): give the
            # first BMC poll a moment to read it; a later read reaches ClusterD on the next reconnect
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.bmc.polled.wait(), self.args.sn_wait)
        await self.agent.start()
        for comp in self.components:
            try:
                await comp.start()
            except Exception as e:
                event(log, logging.ERROR, "component not started", component=comp.name, error=repr(e))
        event(
            log,
            logging.INFO,
            "noded started",
            node=self.node_name,
            clusterd=self.args.clusterd,
            bmc=f"{self.args.bmc_host}:{self.args.bmc_port}" if self.args.bmc_host else "-",
            http=f"{self.http.host}:{self.http.port}",
            components=",".join(c.name for c in self.components),
        )

    async def stop(self) -> None:
        """Stop components, monitors, the agent stream (draining pending changes) and HTTP."""
        for comp in reversed(self.components):
            try:
                await comp.stop()
            except Exception as e:
                event(log, logging.WARNING, "component stop failed", component=comp.name, error=repr(e))
        await self.tasks.close()
        await self.agent.stop()
        await self.http.stop()
        if self.bmc is not None and not self.bmc.client.busy:
            # log out of the BMC (blocking: in the pool, bounded); a hung call is left alone
            with contextlib.suppress(Exception):
                await self.blocking.call(3.0, self.bmc.client.close)
        self.blocking.shutdown()
        event(log, logging.INFO, "noded stopped", node=self.node_name)

    # -- control messages ------------------------------------------------------------------------
    async def on_control(self, msg) -> None:
        """Route a ControlMessage to the component handling its body kind. Raises ``LookupError``
        for a kind nobody handles (the agent client acks it with that error)."""
        kind = msg.WhichOneof("body")
        comp = self._routes.get(kind or "")
        if comp is None:
            event(log, logging.WARNING, "control message unhandled", kind=kind, seq=msg.seq)
            raise LookupError(f"no noded component handles control kind {kind!r}")
        await comp.on_control(msg)

    # -- node-info ---------------------------------------------------------------------------------
    def bmc_faults(self):
        """The BMC faults in the order they were reported."""
        return [f for k, f in self.state.faults.items() if k.source in (SOURCE_OEM, SOURCE_SEL)]

    def node_info(self) -> dict:
        """The reference ``FaultDevInfo`` object for this node (noded.md §4)."""
        return nodeinfo.fault_dev_info(self.bmc_faults())

    def state_hook(self) -> None:
        """Write ``--node-info-file`` when the node-info content changed (hooked to state changes)."""
        path = self.args.node_info_file
        if not path:
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
        try:
            nodeinfo.write_document(self.args.node_info_file, info)
            self._last_doc_digest = digest
        except OSError as e:
            event(log, logging.WARNING, "node-info write failed", path=self.args.node_info_file, error=str(e))

    # -- hooks -------------------------------------------------------------------------------------
    def _serial_read(self, sn: str) -> None:
        if not self.agent.hello.node_sn:
            self.agent.hello.node_sn = sn

    def _levels_changed(self, table: LevelTable) -> None:
        self.metrics.level_reloads.labels("ok").inc()
        if self.bmc is not None:
            self.bmc.publish()

    def _ready(self) -> tuple[bool, str]:
        parts = ["clusterd=" + ("up" if self.agent.connected.is_set() else "down")]
        if self.bmc is not None:
            parts.append(
                "bmc="
                + (
                    "ok"
                    if self.bmc.failures == 0 and self.bmc.polls_ok
                    else (self.bmc.last_error or "pending")
                )
            )
        return True, " ".join(parts)

    async def _node_info_handler(self, request: web.Request) -> web.Response:
        info = self.node_info()
        return json_response({"NodeInfo": info, "CheckCode": nodeinfo.check_code(info)})

    async def _state_handler(self, request: web.Request) -> web.Response:
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
                        "attributes": f.attributes,
                    }
                    for f in self.state.faults.values()
                ],
                "conditions": {
                    t: {"active": c.active, "reason": c.reason, "message": c.message}
                    for t, c in self.state.conditions.items()
                },
                "bmc_mode": self.bmc.mode if self.bmc else None,
                "clusterd_connected": self.agent.connected.is_set(),
            }
        )
