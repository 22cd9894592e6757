"""deviced: accelerator chip, network and switch faults through DCMI, reported over the agent stream.

``deviced --node-name NAME --clusterd 127.0.0.1:8899 --backend dcmi|sim [--dcmi-lib PATH]
[--lingqu-lib PATH] --http-addr 127.0.0.1:0`` (issue 4). This module is the wiring (issue 12):

- the engine (:mod:`deviced.engine`, rules in :mod:`deviced.rules`) is the only owner of device state;
- the backend (:mod:`deviced.backends`, an ``NpuBackend``) is called only through
  :class:`deviced.chipio.ChipIO` (bounded pools, timeouts, counted errors; start with backoff);
- the sources (:data:`deviced.sources.SOURCES`: card drop, chip events, link check, gateway probe,
  lingqu switch) only emit into the engine / switch state;
- the cycle (:mod:`deviced.cycle`) runs the sources' hooks, the engine, the actions (hot reset
  :mod:`deviced.hotreset`, graceful tolerance :mod:`deviced.grace`) and the sinks (:mod:`deviced.sinks`:
  agent state via :mod:`deviced.faults`, reset-config files, state file);
- control messages (:mod:`deviced.control`), table reload (:mod:`deviced.reload`), HTTP
  (:mod:`deviced.http`) and metrics (:mod:`deviced.metrics`).

Start: HTTP and the agent stream, then (in the background) the backend and chip list (retried, node
condition DCMIUnavailable meanwhile), the state file, the sources, the cycle and the table reload.
Stop (staged, within the agents' 15 s grace): stop the sources (4 s), stop the cycle and resets
(3 s), a final report, drain the agent stream (2 s), the final state-file write, then HTTP and pools.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from prometheus_client import CollectorRegistry

from deviced import faultconfig, sections
from deviced import sources as srcmod
from deviced.backends import NpuBackend, make_backend
from deviced.chipio import CALL_ERRORS, ChipIO
from deviced.control import JobControl, release_device
from deviced.cycle import Actions, Cycle
from deviced.engine import FaultEngine, UpgradeReason
from deviced.flags import build_parser
from deviced.grace import GraceFlow
from deviced.grace import check_arguments as check_grace_arguments
from deviced.hotreset import HotReset
from deviced.http import add_routes
from deviced.metrics import CycleMetrics, DevicedCollector
from deviced.relations import RelationRules
from deviced.reload import TableReloader, Tables, load_tables
from deviced.sinks import deviceinfo
from deviced.sinks.agentstate import AgentStateSink
from deviced.sinks.kube_deviceinfo import KubeDeviceInfo
from deviced.sinks.resetcfg import ResetConfigWriter, chips_of
from deviced.sinks.statefile import StateFile
from deviced.sources.lingqu import SWITCH_QUEUE_MAX
from deviced.sources.nvml import add_gpu_route
from deviced.switch import SwitchState
from deviced.tables import TableError
from faultmesh import config, runtime
from faultmesh import log as fmlog
from faultmesh.agent import (
    AgentClient,
    AgentState,
    agent_options,
    channel_credentials,
    check_clusterd_arguments,
)
from faultmesh.dcmi.loader import DcmiError
from faultmesh.httplite import HttpServer
from faultmesh.log import event
from faultmesh.metrics import daemon_registry
from faultmesh.model import now_ms
from faultmesh.runtime import Stage, StopBudget, TaskOwner, staged_stop, wait_for
from faultmesh.source import SourceContext, SourceMetrics, start_sources, stop_sources

__all__ = ["SWITCH_QUEUE_MAX", "DeviceD", "build_parser", "main", "make_backend", "print_device_info"]

log = logging.getLogger("deviced")

STOP_SOURCES_S = 4.0  # shutdown budget (s) of each stage; all together < the agents' 15 s grace
STOP_TASKS_S = 3.0
DRAIN_S = 2.0
STOP_BUDGET_S = 13.0  # the whole staged stop, inside the agents' 15 s grace


class DeviceD:
    """One deviced process, wired (see module docstring). ``backend`` is an ``NpuBackend`` (None:
    loaded, and retried, at start); ``clock`` (ms) is the engine's, injectable."""

    def __init__(
        self, args: argparse.Namespace, backend: NpuBackend | None, clock=now_ms, tables: Tables | None = None
    ) -> None:
        t = tables or load_tables(args)
        self.args = args
        self.node_name = args.node_name
        self.registry = daemon_registry("deviced")
        self.engine = FaultEngine(
            t.codes,
            t.customization,
            clock=clock,
            recover_delay_ms=int(args.recover_delay_s * 1000),
            poll_fallback_ms=int(args.poll_fallback_s * 1000),
            hbm_pair_window_ms=int(args.hbm_pair_window_s * 1000),
            restart_grace_ms=int(args.restart_grace_s * 1000),
            max_codes=args.max_codes_per_chip,
        )
        self.engine.on_reason_change = self._on_reason_change
        self.switch_state = SwitchState(t.switch)
        self.io = ChipIO(args, backend)
        self.relations = RelationRules(
            t.relations,
            t.duration,
            self.switch_state,
            a3=lambda: any(sp >= 0 for sp, _ in self.io.spod.values()),
        )
        self.engine.add_stage(self.relations)
        self.state = AgentState(self.node_name)
        self.tasks = TaskOwner("deviced")
        self.init_retry_s = 5.0
        self.started = False
        self.last_report_ms = 0
        # sinks
        self.agent_sink = AgentStateSink(self.state, self.node_name, self.registry)
        self.agent_sink.expect()  # dcmi / lingqu pending until the first complete report
        self.reset_writer = ResetConfigWriter.from_args(args)
        self.state_file = StateFile(args.state_file, self.engine, self.io.call_errors)
        self.kube_sink = KubeDeviceInfo(args, self.node_name, self.registry) if args.kube else None
        # sources, the action, the cycle
        self.metrics = CycleMetrics(self.registry)
        self.metrics.subscribed.set_function(lambda: 1.0 if self.engine.subscribed else 0.0)
        self.source_metrics = SourceMetrics(self.registry)
        deps = srcmod.Deps(self.engine, self.io, self.switch_state, args, self._wake, self._wake_urgent)
        self.sources = [cls(deps) for cls in srcmod.SOURCES]
        self.chip = self._source(srcmod.ChipEvents)
        self._latency_hook = None
        self.lingqu = self._source(srcmod.LingquSwitch)
        self.link_check = self._source(srcmod.LinkCheck)
        hot_cfg, grace_cfg, reload_cfg = sections.build(args)  # the typed sections, built once
        self.hot_reset = HotReset(hot_cfg, self.engine, self.io, self.tasks, self._wake)
        self.grace = GraceFlow(grace_cfg, self.engine, self.io, self.reset_writer, self.tasks, self._wake)
        self.cycle = Cycle(
            self.engine,
            [s.on_cycle for s in self.sources],
            Actions(self.hot_reset, self.grace),
            self.report_and_save,
            self.metrics.poll_seconds,
            float(args.list_watch_period),
            fast_path=args.fast_fault_path,
        )
        self.reloader = TableReloader(reload_cfg, self.engine, self.switch_state, self._wake, self.relations)
        self.fault_cm, self.fault_config = faultconfig.follower(args, self.reloader)  # --kube
        self.jobs = JobControl(self.node_name, self.engine, self.reset_writer, self._wake)
        self._started_sources: list = []
        self._startup_task: asyncio.Task | None = None
        # the outside: agent stream, HTTP, metrics
        token = config.read_secret(args.token_file, what="--token-file") if args.token_file else None
        self.agent = AgentClient(
            args.clusterd,
            self.node_name,
            "deviced",
            state=self.state,
            on_control=self.on_control,
            registry=self.registry,
            token=token,
            credentials=channel_credentials(args),
            labels=self.grace.hello_labels,
            **agent_options(args),
        )
        self.http = HttpServer(args.http_addr, self.registry, ready=self._ready, token=token)
        add_routes(self.http.app, self.engine, self.node_name)
        if args.backend == "nvml":
            add_gpu_route(self.http.app, self.io, self.node_name)
        self.registry.register(DevicedCollector(self))

    def _source(self, cls):
        return next(s for s in self.sources if isinstance(s, cls))

    # ---------------------------------------------------------------- views of the parts (tests, metrics)
    backend = property(lambda self: self.io.backend, doc="The NPU backend (None until loaded).")
    blocking = property(lambda self: self.io.pool, doc="The DCMI call pool.")
    probe_pool = property(lambda self: self.io.probe_pool, doc="The gateway probe's pool.")
    call_errors = property(lambda self: self.io.call_errors, doc="Failed backend calls by (call, reason).")
    ids = property(lambda self: self.io.ids, doc="Logic id -> DeviceIds.")
    spod = property(lambda self: self.io.spod, doc="Logic id -> (super_pod_id, server_index).")
    cycles = property(lambda self: self.cycle.cycles, doc="Finished cycles.")
    subscribed = property(lambda self: self.engine.subscribed, doc="Fault events come by subscription.")
    switch_subscribed = property(lambda self: self.lingqu.subscribed, doc="The lingqu subscription is up.")
    callbacks = property(lambda self: self.chip.callbacks, doc="Chip callbacks received.")
    callback_drops = property(lambda self: self.chip.callback_drops, doc="Callbacks dropped (rate limit).")
    switch_drops = property(lambda self: self.lingqu.switch_drops, doc="Switch events dropped (queue full).")
    resetting = property(lambda self: self.engine.resetting(), doc="Logic ids being hot-reset.")

    @property
    def subscribe_retry_s(self) -> float:
        """Pause between the chip subscription's 3 tries (s)."""
        return self.chip.subscribe_retry_s

    @subscribe_retry_s.setter
    def subscribe_retry_s(self, s: float) -> None:
        self.chip.subscribe_retry_s = s

    @property
    def report_latency_hook(self):
        """Bench hook, called with ([(event, callback ns)], now ns) after each report; None: off."""
        return self._latency_hook

    @report_latency_hook.setter
    def report_latency_hook(self, hook) -> None:
        self._latency_hook = hook
        self.chip.track_latency = hook is not None

    @property
    def monotonic(self):
        """The hot-reset and link-check clock (s); injectable for tests."""
        return self.hot_reset.monotonic

    @monotonic.setter
    def monotonic(self, fn) -> None:
        self.hot_reset.monotonic = fn
        self.link_check.monotonic = fn

    # ---------------------------------------------------------------- reporting
    def _wake(self) -> None:
        self.cycle.wake()

    def _wake_urgent(self) -> None:
        self.cycle.wake_urgent()

    def report(self) -> None:
        """Push the current view into the sinks: agent state, reset-config files, the latency hook."""
        self.agent_sink.publish(
            self.engine,
            self.switch_state,
            self.io.spod,
            chips_complete=self.cycle.cycles > 0 and not any(d.reinit for d in self.engine.devices.values()),
            switch_complete=self._switch_complete(),
        )
        if self.reset_writer is not None:
            self.reset_writer.update(chips_of(self.engine))
        if self.kube_sink is not None and self.started:
            self.kube_sink.update(self)
        self.last_report_ms = now_ms()
        hook = self._latency_hook
        if hook is not None:
            hook(self.chip.take_latency(), time.monotonic_ns())

    def _switch_complete(self) -> bool:
        """The switch view is complete: the lingqu source does not run, or its first query is done."""
        return self.lingqu.polls_ok > 0 or (self.started and not self.lingqu.supported().ok)

    def report_and_save(self) -> None:
        """:meth:`report`, then the state file (when its content changed)."""
        self.report()
        self.state_file.save()

    def _on_reason_change(self, d, r: UpgradeReason, added: bool) -> None:
        event(
            log,
            logging.WARNING if added else logging.INFO,
            "upgrade fault reason added" if added else "upgrade fault reason released",
            logic_id=d.ids.logic,
            phy_id=d.ids.phy,
            code=self.engine.table.spelling(r.code),
            fault_level=r.level.name,
            upgrade_type=r.kind,
        )

    async def on_control(self, msg) -> None:
        """Control messages from clusterd (``job``: see :class:`deviced.control.JobControl`;
        ``release``: :func:`deviced.control.release_device`)."""
        if msg.WhichOneof("body") == "release":
            release_device(self.engine, msg.release.phy_id, self.report_and_save, msg.release.seen_until_ms)
            return
        await self.jobs.on_control(msg)

    def reload_tables(self) -> bool:
        """Re-read the flag-given table files now (see :class:`deviced.reload.TableReloader`)."""
        return self.reloader.reload()

    async def run_cycle(self) -> None:
        """One cycle now (see :mod:`deviced.cycle`)."""
        await self.cycle.run_cycle()

    # ---------------------------------------------------------------- lifecycle
    def _ready(self) -> tuple[bool, str]:
        """Ready once the devices are listed; the text says whether clusterd is reached and why not
        (``clusterd=down (clusterd refused the token: ...)``), as noded's."""
        link = self.agent.readiness()
        return (True, f"ok {link}") if self.started else (False, f"devices not listed yet {link}")

    async def init_backend(self) -> None:
        """Load / init the backend and list the chips (retried with backoff, DCMIUnavailable
        meanwhile), restore the state file, read each chip's placement."""
        devices = await self.io.open(self.state.set_condition, self.init_retry_s)
        self.engine.set_devices(devices)
        self.state_file.restore()
        await self.io.describe()
        event(
            log,
            logging.INFO,
            "devices listed",
            count=len(devices),
            phy_ids=",".join(str(d.phy) for d in devices),
        )

    async def subscribe(self) -> None:
        """Subscribe to chip fault events (3 tries; failure -> polling). :meth:`start` does this."""
        await self.chip.subscribe()

    def _make_ctx(self, src) -> SourceContext:
        return SourceContext(
            src.name, self.node_name, self.state, self.io.pool, self.args, self.registry, self.source_metrics
        )

    async def start(self) -> None:
        """Start HTTP, the agent stream and (in the background) the rest. Raises ``OSError`` when
        HTTP cannot bind."""
        await self.http.start()
        if self.kube_sink is not None:
            await self.kube_sink.start()
        if self.fault_cm is not None:
            await self.fault_cm.start()
        await self.agent.start()
        self._startup_task = self.tasks.spawn(self._startup(), name="deviced-startup")

    async def _startup(self) -> None:
        await self.init_backend()
        await start_sources(self.sources, self._make_ctx, self._started_sources)
        self.started = True
        self.cycle.wake()  # first cycle at once (it mends every chip by polling)
        self.tasks.spawn(self.cycle.run(), name="deviced-cycle")
        if self.args.table_reload_interval > 0:
            self.tasks.spawn(self.reloader.run(), name="deviced-table-reload")

    async def stop(self) -> None:
        """Staged stop (see module docstring): sources, cycle and resets, final report, agent drain,
        state file, HTTP and pools. A startup still running is cancelled first, so the sources it
        started are stopped and it spawns no cycle after the close."""
        if self._startup_task is not None:
            self._startup_task.cancel()
            await asyncio.wait([self._startup_task], timeout=STOP_TASKS_S)
        started, self._started_sources = self._started_sources, []

        async def final_report(t: float) -> None:
            if self.started:
                self.report()

        async def save_state(t: float) -> None:
            self.state_file.save()

        stages: list[Stage] = [
            # stop_sources keeps its own budget: the stage's bound (1 s more) is only a backstop
            ("sources", lambda t: stop_sources(started, max(0.1, t - 1.0)), STOP_SOURCES_S + 1.0),
            ("tasks", lambda t: self.tasks.close(max(0.1, t - 1.0)), STOP_TASKS_S + 1.0),
            ("report", final_report, 1.0),
            ("agent", lambda t: self.agent.stop(drain_s=max(0.1, t - 1.0)), DRAIN_S + 1.0),
        ]
        if self.kube_sink is not None:
            stages.append(("kube", lambda t: self.kube_sink.stop(max(0.1, t - 1.0)), DRAIN_S + 1.0))
        if self.fault_cm is not None:
            stages.append(("kube-fault-config", lambda t: self.fault_cm.stop(), 3.0))
        stages += [("state-file", save_state, 2.0), ("http", lambda t: self.http.stop(), 2.0)]
        await staged_stop("deviced", stages, StopBudget(STOP_BUDGET_S), log)
        self.io.shutdown()
        event(log, logging.INFO, "deviced stopped", node=self.node_name)


async def print_device_info(args: argparse.Namespace, backend) -> int:
    """``--print-device-info``: one full poll and cycle, then the device-info document on stdout."""
    app = DeviceD(args, backend)
    try:
        await wait_for(app.init_backend(), 30)
        await app.run_cycle()
        sw = getattr(app.backend, "switch", None)
        if sw is not None and not args.no_switch:
            try:
                await app.io.call("lq_init", sw.init)
                app.switch_state.replace(await app.io.call("lq_fault_info", sw.fault_info))
            except CALL_ERRORS:
                pass
        print(deviceinfo.render_json(app))
        return 0
    except TimeoutError:
        event(log, logging.ERROR, "device listing timed out")
        return 1
    finally:
        app.io.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Console script ``deviced``."""
    import socket

    parser = build_parser()
    args = config.parse(parser, argv)
    check_clusterd_arguments(parser, args)
    check_grace_arguments(parser, args)
    fmlog.setup_from_args(args)
    if not args.node_name:
        args.node_name = socket.gethostname()
    try:
        backend = make_backend(args)
    except DcmiError as e:
        if args.print_device_info:
            event(log, logging.ERROR, "dcmi library unavailable", error=str(e))
            return 1
        # keep running: the agent stream reports DCMIUnavailable and loading is retried
        event(
            log,
            logging.ERROR,
            "dcmi library unavailable",
            error=str(e),
            action="retrying with backoff from 5 s",
        )
        backend = None
    try:
        tables = load_tables(args)  # once: a bad entry is warned about once
    except TableError as e:
        event(log, logging.ERROR, "fault table unusable", error=str(e))
        return 2

    async def _main(stop: asyncio.Event) -> int:
        if args.print_device_info:
            return await print_device_info(args, backend)
        try:
            app = DeviceD(args, backend, tables=tables)
        except (OSError, TableError) as e:  # unreadable TLS files, tables changed since the check
            event(log, logging.ERROR, "deviced failed to start", error=str(e))
            return 1
        sim_http = None
        try:
            if args.backend == "sim":
                from deviced import simapi

                if args.sim_control_addr:
                    sim_http = HttpServer(args.sim_control_addr, CollectorRegistry(), token=app.agent.token)
                    simapi.add_routes(sim_http.app, backend)
                    await sim_http.start()
                    event(log, logging.INFO, "sim control listening", addr=f"{sim_http.host}:{sim_http.port}")
                else:
                    simapi.add_routes(app.http.app, backend)
            await app.start()
        except OSError as e:
            event(log, logging.ERROR, "deviced failed to start", error=str(e))
            await app.stop()
            return 1
        event(
            log,
            logging.INFO,
            "deviced started",
            http=f"{app.http.host}:{app.http.port}",
            node=args.node_name,
            backend=args.backend,
        )
        await stop.wait()
        await app.stop()
        if sim_http is not None:
            await sim_http.stop()
        return 0

    return runtime.run(_main, fast_loop=False)  # idle agent: asyncio's loop, 2.6 MiB less
