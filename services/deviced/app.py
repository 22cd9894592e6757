"""deviced: accelerator chip, network and switch faults through DCMI, reported over the agent stream.

``deviced --node-name NAME --clusterd 127.0.0.1:8899 --backend dcmi|sim [--dcmi-lib PATH]
[--lingqu-lib PATH] --http-addr 127.0.0.1:0`` (issue 4). Flow (reference deviced.md §1.1-§1.2):

- start: load the backend, ``dcmi_init``, walk cards × devices, subscribe to fault events (3 tries,
  1 s apart; failure -> polling for the process lifetime, "fault get mode downgrade").
- callbacks arrive on a C thread: a token bucket (``--callback-rate-limit`` per minute, default 1000)
  is taken right there; accepted events are queued and handed to the loop with one
  ``call_soon_threadsafe`` per batch; an overflow drops the event, counts it and puts the chip in the
  re-init set (re-polled next cycle). Nothing calls DCMI from the callback.
- the cycle runs within ~1 s of a callback and at least every ``--list-watch-period`` s (3..1800):
  card-drop check (health -8012), mend polling, engine cycle, reporting (``replace_source('dcmi')`` +
  ``set_device``), reset-config files, hot reset.
- gateway probe every ``--probe-interval`` s (2.5), 1 s timeout per call, feeding the 20 s rule.
- switch (lingqu): subscription plus a full query at start and every ``--switch-query-interval`` s
  (300); every cycle when the subscription failed.

HTTP (``--http-addr``): ``/metrics``, ``/healthz``, ``/readyz``, ``GET /v1/devices`` (every chip:
health, levels, codes with first-seen ms, escalations) and ``POST /v1/devices/<phy>/release`` (operator
release of a ManuallySeparateNPU chip).

Every DCMI call runs in a ``BlockingPool`` with a timeout; a hanging call is counted and the chip is
skipped for the cycle, the loop stays responsive.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from deviced import deviceinfo
from deviced.engine import OCCUR, RECOVER, DeviceEvent, FaultEngine, TokenBucket, UpgradeReason
from deviced.resetcfg import ChipFault, ResetConfigWriter, atomic_write
from deviced.switch import SwitchState
from deviced.tables import (
    GATEWAY_PROBE,
    LINK_DOWN,
    NETWORK_CODES_ALL,
    Customization,
    FaultCodeTable,
    SwitchFaultTable,
    TableError,
)
from faultmesh import config, runtime
from faultmesh import log as fmlog
from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentClient, AgentState, add_clusterd_arguments, channel_credentials
from faultmesh.dcmi.api import DevFaultEvent, DeviceIds
from faultmesh.dcmi.lingqu import SwitchEvent
from faultmesh.dcmi.loader import DcmiError, DeviceNotReady
from faultmesh.dcmi.structs import BOOT_START_FINISH, network_probe_healthy
from faultmesh.httpd import HttpServer, json_response
from faultmesh.levels import NpuLevel
from faultmesh.log import event
from faultmesh.model import Fault, now_ms
from faultmesh.runtime import BlockingPool, BlockingTimeout, TaskOwner

log = logging.getLogger("deviced")

SOURCE = "dcmi"
HOT_RESET_LEVELS = (NpuLevel.RestartNPU, NpuLevel.FreeRestartNPU)
SWITCH_QUEUE_MAX = 10_000  # queued switch events; beyond, a full query replaces them
HOT_RESET_FAILED = "HotResetFailed"  # upgrade-reason kind of a failed or refused reset (-> SeparateNPU)


def _range(lo: float, hi: float, typ=int):
    def conv(s: str):
        v = typ(s)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} outside {lo}..{hi}")
        return v

    return conv


def build_parser() -> argparse.ArgumentParser:
    """deviced's flags (issue 4; reference §8 for the list-watch range)."""
    p = argparse.ArgumentParser(
        prog="deviced", description="faultmesh deviced: NPU, network and switch faults"
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (env NODE_NAME, else hostname)",
    )
    add_clusterd_arguments(p)
    p.add_argument("--backend", choices=("dcmi", "sim"), default="dcmi")
    p.add_argument("--dcmi-lib", help="path of libdcmi.so (default: the driver lib dirs)")
    p.add_argument(
        "--dcmi-api",
        choices=("auto", "v1", "v2"),
        default="auto",
        help="DCMI family: v1 (card/device; 910, A2, A3), v2 (dev id; A5); auto = v1 when exported, else v2",
    )
    p.add_argument("--lingqu-lib", help="path of liblingqu-dcmi.so (default: the driver lib dirs)")
    p.add_argument("--no-switch", action="store_true", help="do not watch lingqu switch faults")
    p.add_argument("--hccn-tool", default="/usr/local/Ascend/driver/tools/hccn_tool", help="hccn_tool path")
    p.add_argument(
        "--link-check-interval",
        type=float,
        default=300.0,
        help="s between hccn_tool link checks of a chip without network codes (reference: 5 min); 0 = off",
    )
    p.add_argument("--http-addr", default="127.0.0.1:0", help="metrics/health HTTP address")
    p.add_argument("--sim-control-addr", help="sim backend: separate HTTP address of the control API")
    p.add_argument("--sim-cards", type=int, default=1)
    p.add_argument("--sim-devices-per-card", type=int, default=8)
    p.add_argument("--fault-code-file", help="faultCode.json (default: faultmesh's table)")
    p.add_argument("--fault-customization-file", help="faultCustomization.json")
    p.add_argument("--switch-fault-code-file", help="SwitchFaultCode.json")
    p.add_argument("--list-watch-period", type=_range(3, 1800), default=5, help="s, 3..1800")
    p.add_argument(
        "--table-reload-interval",
        type=float,
        default=300.0,
        help="s between checks of the table files for changes (reference PollInterval); 0 = never",
    )
    p.add_argument("--probe-interval", type=float, default=2.5, help="gateway probe period (s); 0 = off")
    p.add_argument("--switch-query-interval", type=float, default=300.0, help="s between full switch queries")
    p.add_argument("--callback-rate-limit", type=int, default=1000, help="accepted callbacks per minute")
    p.add_argument("--dcmi-timeout", type=float, default=5.0, help="s per DCMI call")
    p.add_argument("--no-subscribe", action="store_true", help="poll only (no fault subscription)")
    p.add_argument("--reset-config-dir", help="directory of per-job reset-config files (off when unset)")
    p.add_argument(
        "--state-file",
        help="JSON file keeping escalations (ManuallySeparateNPU, failed resets) across restarts",
    )
    p.add_argument("--hot-reset", action="store_true", help="hot-reset idle RestartNPU/FreeRestartNPU chips")
    p.add_argument("--hot-reset-idle", type=float, default=60.0, help="s a chip must be idle before a reset")
    p.add_argument("--hot-reset-boot-timeout", type=float, default=180.0, help="s to wait for boot")
    p.add_argument("--print-device-info", action="store_true", help="print the device-info document and exit")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-file")
    return p


class _EngineCollector(Collector):
    """Exports the engine's exact counters (events by source and level, outcomes) at scrape time."""

    def __init__(self, app: DeviceD) -> None:
        self.app = app

    def collect(self):
        ev = CounterMetricFamily(
            "faultmesh_deviced_events",
            "Fault events handled, by source and level",
            labels=["source", "level"],
        )
        for (src, level), n in sorted(self.app.engine.levels_by_event.items()):
            ev.add_metric([src, level], n)
        yield ev
        out = CounterMetricFamily("faultmesh_deviced_event_outcomes", "Event outcomes", labels=["outcome"])
        for k, n in sorted(self.app.engine.stats.items()):
            out.add_metric([k], n)
        yield out
        drops = CounterMetricFamily(
            "faultmesh_deviced_callback_drops",
            "Callbacks dropped: chip (token bucket) or switch (queue full)",
            labels=["kind"],
        )
        drops.add_metric(["chip"], self.app.callback_drops)
        drops.add_metric(["switch"], self.app.switch_drops)
        yield drops
        cbs = CounterMetricFamily("faultmesh_deviced_callbacks", "Callbacks received from the driver")
        cbs.add_metric([], self.app.callbacks)
        yield cbs
        unk = CounterMetricFamily(
            "faultmesh_deviced_unknown_event_types",
            "Callbacks with an event type other than a DMS fault event",
        )
        dcmi = getattr(self.app.backend, "dcmi", None)
        unk.add_metric([], getattr(dcmi, "unknown_events", 0))
        yield unk
        errs = CounterMetricFamily(
            "faultmesh_deviced_dcmi_errors", "Failed DCMI calls", labels=["call", "reason"]
        )
        for (call, reason), n in sorted(self.app.call_errors.items()):
            errs.add_metric([call, reason], n)
        yield errs


class DeviceD:
    """One deviced process. ``backend`` is a :mod:`deviced.backends` object; ``clock`` (ms) is injectable."""

    def __init__(self, args: argparse.Namespace, backend: Any, clock=now_ms) -> None:
        self.args = args
        self.backend = backend
        self.node_name = args.node_name
        self.registry = CollectorRegistry()
        self.engine = FaultEngine(
            FaultCodeTable.load(args.fault_code_file),
            Customization.load(args.fault_customization_file),
            clock=clock,
        )
        self.engine.on_reason_change = self._on_reason_change
        self.switch_state = SwitchState(SwitchFaultTable.load(args.switch_fault_code_file))
        self.state = AgentState(self.node_name)
        token = config.read_secret(args.token_file) if args.token_file else None
        self.agent = AgentClient(
            args.clusterd,
            self.node_name,
            "deviced",
            state=self.state,
            on_control=self.on_control,
            registry=self.registry,
            token=token,
            credentials=channel_credentials(args),
        )
        self.http = HttpServer(args.http_addr, self.registry, ready=self._ready)
        self.http.app.router.add_get("/v1/devices", self._http_devices)
        self.http.app.router.add_post("/v1/devices/{phy}/release", self._http_release)
        self.tasks = TaskOwner("deviced")
        self.blocking = BlockingPool(4, "dcmi")
        self.probe_pool = BlockingPool(2, "dcmi-probe")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.trigger = asyncio.Event()
        self.subscribed = False
        self.subscribe_retry_s = 1.0  # §1.1: 3 tries, 1 s apart
        self.init_retry_s = 5.0
        self.switch_subscribed = False
        self.started = False
        self.callbacks = 0
        self.callback_drops = 0
        self.call_errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self._cb_lock = threading.Lock()
        self._cb_queue: list[tuple[DevFaultEvent, int]] = []
        self._cb_overflow: set[int] = set()
        self._cb_scheduled = False
        self._sw_queue: list[SwitchEvent] = []
        self._switch_resync = False
        self.switch_drops = 0
        self._ratelog = fmlog.RateLimitedLog(log, 10.0)
        self.bucket = TokenBucket(args.callback_rate_limit, clock=lambda: time.monotonic_ns() // 1_000_000)
        self.ids: dict[int, DeviceIds] = {}
        self.spod: dict[int, tuple[int, int]] = {}
        self.chip_names: dict[int, str] = {}
        self.reset_writer = (
            ResetConfigWriter(args.reset_config_dir, "hotReset" if args.hot_reset else "podReschedule")
            if args.reset_config_dir
            else None
        )
        self.jobs_ranks: dict[str, dict[int, int]] = {}
        self.reset_buckets: dict[int, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.idle_since: dict[int, float] = {}
        self.resetting: set[int] = set()
        self.cycles = 0
        self.last_report_ms = 0
        self.report_latency_hook = None  # bench: called with ([(event, cb_ns)], now_ns) after each report
        self._pending_latency: list[tuple[DevFaultEvent, int]] = []
        self._last_cycle = 0.0
        self._saved_state = ""
        self.monotonic = time.monotonic  # hot-reset and link-check clock (s); injectable for tests
        self.link_checked: dict[int, float] = {}
        self.link_raised: set[int] = set()
        self.registry.register(_EngineCollector(self))
        self.poll_seconds = Histogram(
            "faultmesh_deviced_poll_duration_seconds",
            "Duration of one deviced cycle's DCMI polling",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 1, 5, 30),
            registry=self.registry,
        )
        self.health_gauge = Gauge(
            "faultmesh_deviced_device_healthy",
            "1 when the chip is Healthy, 0 otherwise",
            ["node", "device"],
            registry=self.registry,
        )
        self.net_gauge = Gauge(
            "faultmesh_deviced_device_network_healthy",
            "1 when the chip's network is Healthy, 0 otherwise",
            ["node", "device"],
            registry=self.registry,
        )
        self.subscribed_gauge = Gauge(
            "faultmesh_deviced_subscribed",
            "1 while fault events come by subscription",
            registry=self.registry,
        )

    # ---------------------------------------------------------------- HTTP API
    def device_views(self) -> list[dict[str, Any]]:
        """Every chip as JSON: ids, health, levels, active codes (level, first seen ms), escalations."""
        out = []
        for logic, d in sorted(self.engine.devices.items()):
            worst = self.engine.worst_level(d)
            out.append(
                {
                    "logic_id": logic,
                    "phy_id": d.ids.phy,
                    "card_id": d.ids.card,
                    "device_id": d.ids.device,
                    "health": d.health,
                    "network_health": d.network_health,
                    "level": worst.name if worst is not None else "",
                    "chip_level": d.level.name if d.level is not None else "",
                    "network_level": d.network_level.name if d.network_level is not None else "",
                    "in_use": d.in_use,
                    "resetting": d.resetting,
                    "manually_separated": d.manually_separated,
                    "codes": [
                        {
                            "code": self.engine.table.spelling(c),
                            "level": self.engine.code_level(d, c).name,
                            "plane": "network" if c in NETWORK_CODES_ALL else "chip",
                            "first_seen_ms": st.first_seen_ms,
                        }
                        for c, st in sorted(d.codes().items())
                    ],
                    "upgrades": [
                        {
                            "code": self.engine.table.spelling(r.code) if r.code else HOT_RESET_FAILED,
                            "level": r.level.name,
                            "type": r.kind,
                            "time_ms": r.time_ms,
                        }
                        for r in d.reasons.values()
                    ],
                }
            )
        return out

    async def _http_devices(self, request: web.Request) -> web.Response:
        return json_response(
            {"node": self.node_name, "subscribed": self.subscribed, "devices": self.device_views()}
        )

    async def _http_release(self, request: web.Request) -> web.Response:
        """Operator release of a ManuallySeparateNPU chip (the reference: deleting its name from the CM)."""
        try:
            phy = int(request.match_info["phy"])
        except ValueError:
            return json_response({"error": "phy id must be an integer"}, status=400)
        logic = next((lg for lg, d in self.engine.devices.items() if d.ids.phy == phy), None)
        if logic is None:
            return json_response({"error": f"no chip with physical id {phy}"}, status=404)
        released = self.engine.release_manual(logic)
        event(log, logging.WARNING, "manual separation released by operator", phy_id=phy, released=released)
        self.report()
        self._save_state()
        return json_response({"phy_id": phy, "released": released})

    # ---------------------------------------------------------------- lifecycle
    def _ready(self) -> tuple[bool, str]:
        return (True, "ok") if self.started else (False, "devices not listed yet")

    async def call(
        self, name: str, fn, *args, timeout_s: float | None = None, pool: BlockingPool | None = None
    ):
        """Run a blocking backend call with a timeout; errors are counted by (call, reason) and re-raised."""
        try:
            return await (pool or self.blocking).call(timeout_s or self.args.dcmi_timeout, fn, *args)
        except BlockingTimeout:
            self.call_errors[(name, "timeout")] += 1
            raise
        except DeviceNotReady:
            self.call_errors[(name, "device not ready")] += 1
            raise
        except DcmiError as e:
            self.call_errors[(name, type(e).__name__)] += 1
            raise

    async def init_backend(self) -> None:
        """Load the library (when not loaded yet), ``init``, device walk; retried every
        ``init_retry_s`` s until it works, with the node condition DCMIUnavailable set meanwhile (so
        clusterd shows why this node reports no chips)."""
        while True:
            try:
                if self.backend is None:
                    self.backend = await self.call("load", make_backend, self.args)
                await self.call("init", self.backend.init)
                devices = await self.call("devices", self.backend.devices)
                break
            except (DcmiError, BlockingTimeout, ValueError) as e:
                reason = "library missing" if self.backend is None else "init failed"
                if self.state.set_condition("DCMIUnavailable", True, reason, str(e)):
                    event(log, logging.ERROR, "dcmi unavailable", reason=reason, error=str(e))
                await asyncio.sleep(self.init_retry_s)
        self.state.set_condition("DCMIUnavailable", False)
        self.ids = {d.logic: d for d in devices}
        self.engine.set_devices(devices)
        self._restore_state()
        for d in devices:
            try:
                self.spod[d.logic] = await self.call("spod", self.backend.spod, d)
                self.chip_names[d.logic] = await self.call("chip_name", self.backend.chip_name, d)
            except (DcmiError, BlockingTimeout):
                self.spod[d.logic] = (-2, -2)
        event(
            log,
            logging.INFO,
            "devices listed",
            count=len(devices),
            phy_ids=",".join(str(d.phy) for d in devices),
        )

    async def subscribe(self) -> None:
        """Subscribe to chip fault events: 3 tries, 1 s apart (§1.1); failure -> polling for good."""
        if self.args.no_subscribe:
            self._downgrade("subscription disabled by flag")
            return
        for attempt in range(1, 4):
            try:
                await self.call("subscribe", self.backend.subscribe, self._on_c_event)
                self.subscribed = True
                self.subscribed_gauge.set(1)
                event(log, logging.INFO, "fault subscription up", attempt=attempt)
                return
            except (DcmiError, BlockingTimeout) as e:
                event(log, logging.WARNING, "fault subscription failed", attempt=attempt, error=str(e))
                await asyncio.sleep(self.subscribe_retry_s)
        self._downgrade("subscribe failed 3 times")

    def _downgrade(self, why: str) -> None:
        self.engine.subscribe_failed = True
        self.subscribed = False
        self.subscribed_gauge.set(0)
        event(log, logging.WARNING, "fault get mode downgrade", cause=why)

    async def start(self) -> None:
        """Start HTTP, the backend, the loops and the agent stream. Raises ``OSError`` when HTTP cannot bind."""
        self.loop = asyncio.get_running_loop()
        await self.http.start()
        await self.agent.start()
        self.tasks.spawn(self._startup(), name="deviced-startup")

    async def _startup(self) -> None:
        await self.init_backend()
        await self.subscribe()
        self.started = True
        self.trigger.set()  # first cycle at once (it mends every chip by polling)
        self.tasks.spawn(self._main_loop(), name="deviced-cycle")
        if self.args.probe_interval > 0:
            self.tasks.spawn(self._probe_loop(), name="deviced-probe")
        if getattr(self.backend, "switch", None) is not None and not self.args.no_switch:
            self.tasks.spawn(self._switch_loop(), name="deviced-switch")
        if self.args.table_reload_interval > 0:
            self.tasks.spawn(self._reload_loop(), name="deviced-table-reload")

    async def stop(self) -> None:
        """Stop the loops, drain the agent stream (2 s), stop HTTP and the pools."""
        await self.tasks.close()
        await self.agent.stop()
        await self.http.stop()
        self.blocking.shutdown()
        self.probe_pool.shutdown()

    # ---------------------------------------------------------------- callbacks (C thread)
    def _on_c_event(self, ev: DevFaultEvent) -> None:
        """Runs on the driver's thread: token bucket, queue, one wake-up per batch. Never calls DCMI."""
        t = time.monotonic_ns()
        with self._cb_lock:
            self.callbacks += 1
            if self.bucket.take():
                self._cb_queue.append((ev, t))
            else:
                self.callback_drops += 1
                self._cb_overflow.add(ev.logic_id)
            if self._cb_scheduled or self.loop is None:
                return
            self._cb_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain_callbacks)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _drain_callbacks(self) -> None:
        with self._cb_lock:
            batch, self._cb_queue = self._cb_queue, []
            overflow, self._cb_overflow = self._cb_overflow, set()
            self._cb_scheduled = False
        now = self.engine.now()
        for ev, _t in batch:
            if ev.assertion not in (0, 1, 2):
                self.engine.stats["rejected_bad_assertion"] += 1
                continue
            event(
                log,
                logging.DEBUG,
                "receive devFaultInfo",
                logic_id=ev.logic_id,
                code=f"{ev.event_id:08X}",
                assertion=ev.assertion,
                severity=ev.severity,
            )
            self.engine.submit(
                DeviceEvent(ev.logic_id, ev.event_id, ev.assertion, ev.severity, now, "callback")
            )
        for logic in overflow:
            if logic in self.engine.devices:
                self.engine.mark_reinit(logic)
            else:
                self.engine.stats["rejected_unknown_device"] += 1
        if overflow:
            self._ratelog.warning(
                "callback-overflow",
                "callback rate limit overflow",
                devices=len(overflow),
                dropped=self.callback_drops,
            )
        if self.report_latency_hook is not None:
            self._pending_latency.extend(batch)
        self.trigger.set()

    def _on_switch_event(self, ev: SwitchEvent) -> None:
        with self._cb_lock:
            if len(self._sw_queue) >= SWITCH_QUEUE_MAX:
                self.switch_drops += 1  # bounded: the next cycle re-reads the full list instead
                self._switch_resync = True
                return
            self._sw_queue.append(ev)
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self.trigger.set)
            except RuntimeError:
                pass

    # ---------------------------------------------------------------- the cycle
    async def _main_loop(self) -> None:
        period = float(self.args.list_watch_period)
        while True:
            wait = period
            nxt = self.engine._pending[0][0] if self.engine._pending else None
            if nxt is not None:
                wait = min(wait, max(0.05, (nxt - self.engine.now()) / 1000))
            if self.idle_since or self.resetting:  # hot-reset candidates: check the idle gate each second
                wait = min(wait, 1.0)
            try:
                await asyncio.wait_for(self.trigger.wait(), wait)
            except TimeoutError:
                pass
            gap = 1.0 - (time.monotonic() - self._last_cycle)
            if self.trigger.is_set() and gap > 0 and self.cycles > 0:
                await asyncio.sleep(min(gap, 1.0))  # at most one callback-triggered cycle per second
            self.trigger.clear()
            try:
                await self.run_cycle()
            except Exception as e:  # one bad cycle must not end the loop
                event(log, logging.ERROR, "cycle failed", error=repr(e))

    async def run_cycle(self) -> None:
        """One cycle (reference §1.2): card drop, mend polling, switch events, engine, report."""
        self._last_cycle = time.monotonic()
        t0 = time.perf_counter()
        if self.subscribed:
            await self._check_card_drop()
        await self._mend()
        await self._check_links()
        self.poll_seconds.observe(time.perf_counter() - t0)
        await self._apply_switch_events()
        self.engine.cycle()
        self.cycles += 1
        await self._hot_reset_step()
        self.report()
        self._save_state()

    async def _check_card_drop(self) -> None:
        for logic, ids in self.ids.items():
            try:
                await self.call("health", self.backend.health, ids)
                self.engine.set_card_drop(logic, False)
            except DeviceNotReady:
                self.engine.set_card_drop(logic, True)
            except (DcmiError, BlockingTimeout):
                continue

    async def _check_links(self) -> None:
        """hccn_tool link state for chips that have no network code (reference §1.1 "Link status"),
        at most once per ``--link-check-interval`` per chip: DOWN raises 81078603 (which then runs the
        20 s rule); UP recovers the 81078603 this check raised."""
        interval = self.args.link_check_interval
        if interval <= 0 or not hasattr(self.backend, "link_up"):
            return
        now = self.monotonic()
        for logic, ids in self.ids.items():
            d = self.engine.devices[logic]
            mine = logic in self.link_raised
            if d.network and not (mine and set(d.network) == {LINK_DOWN}):
                continue  # the driver reports network codes itself
            if now - self.link_checked.get(logic, -1e18) < interval:
                continue
            self.link_checked[logic] = now
            try:
                up = await self.call("hccn_link", self.backend.link_up, ids, timeout_s=10)
            except (DcmiError, BlockingTimeout):
                continue
            if up is False and not mine and LINK_DOWN not in d.network:
                self.link_raised.add(logic)
                self.engine.submit(DeviceEvent(logic, LINK_DOWN, OCCUR, 0, self.engine.now(), "link"))
                event(log, logging.WARNING, "link down found by hccn_tool", logic_id=logic, phy_id=ids.phy)
            elif up is True and mine:
                self.link_raised.discard(logic)
                self.engine.submit(DeviceEvent(logic, LINK_DOWN, RECOVER, 0, self.engine.now(), "link"))
                event(log, logging.INFO, "link up found by hccn_tool", logic_id=logic, phy_id=ids.phy)

    async def _mend(self) -> None:
        for logic, ids in self.ids.items():
            reason = self.engine.mend_reason(logic)
            if reason is None:
                continue
            read_at = self.engine.begin_poll(logic)
            try:
                codes = await self.call("errorcode", self.backend.error_codes, ids)
            except (DcmiError, BlockingTimeout) as e:
                event(log, logging.WARNING, "error code poll failed", logic_id=logic, error=str(e))
                self.engine.mark_reinit(logic)  # try again next cycle
                continue
            dropped = False
            try:
                await self.call("health", self.backend.health, ids)
            except DeviceNotReady:
                dropped = True
            except (DcmiError, BlockingTimeout):
                pass
            if dropped:
                self.engine.devices[logic].card_dropped = True
                codes = [*codes, 0x40F84E00]
            elif self.engine.devices[logic].card_dropped:
                self.engine.devices[logic].card_dropped = False
            if logic in self.link_raised:
                codes = [*codes, LINK_DOWN]  # raised from hccn_tool, not in the driver's list
            n = self.engine.apply_poll(logic, codes, read_at)
            if n:
                event(
                    log,
                    logging.INFO,
                    "fault codes mended by polling",
                    logic_id=logic,
                    reason=reason,
                    events=n,
                )

    # ---------------------------------------------------------------- gateway probe
    async def _probe_loop(self) -> None:
        while True:
            for logic, ids in self.ids.items():
                try:
                    result = await self.call(
                        "network_health",
                        self.backend.network_health,
                        ids,
                        timeout_s=1.0,
                        pool=self.probe_pool,
                    )
                except (DcmiError, BlockingTimeout):
                    continue
                if self.engine.set_probe(logic, network_probe_healthy(result)):
                    event(log, logging.INFO, "gateway probe changed", logic_id=logic, result=result)
                    self.trigger.set()
            await asyncio.sleep(self.args.probe_interval)

    # ---------------------------------------------------------------- table reload
    def _table_stamps(self) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for path in (
            self.args.fault_code_file,
            self.args.fault_customization_file,
            self.args.switch_fault_code_file,
        ):
            if path:
                try:
                    st = os.stat(path)
                    out[path] = (st.st_mtime_ns, st.st_size)
                except OSError:
                    out[path] = None
        return out

    def reload_tables(self) -> bool:
        """Re-read the table files given by flags, each on its own: a file that fails keeps its old
        table (logged). Returns True when every file loaded."""
        a = self.args
        loaded: dict[str, Any] = {}
        for name, loader, path in (
            ("faultCode.json", FaultCodeTable.load, a.fault_code_file),
            ("faultCustomization.json", Customization.load, a.fault_customization_file),
            ("SwitchFaultCode.json", SwitchFaultTable.load, a.switch_fault_code_file),
        ):
            if not path:
                continue
            try:
                loaded[name] = loader(path)
            except TableError as e:
                event(log, logging.ERROR, "fault table reload failed", table=name, error=str(e))
        n = self.engine.reload(loaded.get("faultCode.json"), loaded.get("faultCustomization.json"))
        if "SwitchFaultCode.json" in loaded:
            self.switch_state.table = loaded["SwitchFaultCode.json"]
        event(log, logging.INFO, "fault tables reloaded", tables=",".join(sorted(loaded)), reasons_changed=n)
        self.trigger.set()
        return all(
            name in loaded
            for name, path in (
                ("faultCode.json", a.fault_code_file),
                ("faultCustomization.json", a.fault_customization_file),
                ("SwitchFaultCode.json", a.switch_fault_code_file),
            )
            if path
        )

    async def _reload_loop(self) -> None:
        stamps = self._table_stamps()
        while True:
            await asyncio.sleep(self.args.table_reload_interval)
            now = self._table_stamps()
            if now != stamps:
                stamps = now
                self.reload_tables()

    # ---------------------------------------------------------------- switch
    async def _switch_loop(self) -> None:
        sw = self.backend.switch
        try:
            await self.call("lq_init", sw.init)
        except (DcmiError, BlockingTimeout) as e:
            event(log, logging.ERROR, "switch init failed", error=str(e))
            return
        for attempt in range(1, 4):
            try:
                await self.call("lq_subscribe", sw.subscribe, self._on_switch_event)
                self.switch_subscribed = True
                break
            except (DcmiError, BlockingTimeout) as e:
                event(log, logging.WARNING, "switch subscription failed", attempt=attempt, error=str(e))
                await asyncio.sleep(1)
        while True:
            try:
                events = await self.call("lq_fault_info", sw.fault_info)
                if self.switch_state.replace(events):
                    self.trigger.set()
                event(log, logging.INFO, "switch of 910A3 get fault codes", count=len(events))
            except (DcmiError, BlockingTimeout) as e:
                event(log, logging.WARNING, "switch query failed", error=str(e))
            interval = (
                self.args.switch_query_interval if self.switch_subscribed else self.args.list_watch_period
            )
            await asyncio.sleep(interval)

    async def _apply_switch_events(self) -> None:
        with self._cb_lock:
            batch, self._sw_queue = self._sw_queue, []
            resync, self._switch_resync = self._switch_resync, False
        for ev in batch:
            self.switch_state.apply(ev)
        if resync and getattr(self.backend, "switch", None) is not None:
            try:
                self.switch_state.replace(await self.call("lq_fault_info", self.backend.switch.fault_info))
            except (DcmiError, BlockingTimeout):
                self._switch_resync = True

    # ---------------------------------------------------------------- reporting
    def faults(self) -> list[Fault]:
        """The chip and network faults to report (one per active code, plus held upgrade reasons).

        ``device_id`` is the chip's **physical** id (the id rank tables and clusterd's job view use);
        the logic id is in ``attributes["logic_id"]``.
        """
        out = []
        now = self.engine.now()
        for logic, d in sorted(self.engine.devices.items()):
            active = d.codes()
            for code, st in sorted(active.items()):
                level, unknown = self.engine._code_level(code, st.severity)
                attrs = {
                    "logic_id": str(logic),
                    "plane": "network" if code in NETWORK_CODES_ALL else "chip",
                    "base_level": level.name,
                }
                if unknown:
                    attrs["unknown"] = "true"
                if code == GATEWAY_PROBE:
                    attrs["signal"] = "gateway-probe"
                ups = [r.kind for (c, _k), r in d.reasons.items() if c == code]
                if ups:
                    attrs["upgrade"] = ",".join(sorted(ups))
                out.append(
                    Fault(
                        source=SOURCE,
                        node=self.node_name,
                        device_type="NPU",
                        device_id=d.ids.phy,
                        code=self.engine.table.spelling(code),
                        level=self.engine.code_level(d, code).name,
                        assertion="once" if st.once else "occur",
                        first_seen_ms=st.first_seen_ms,
                        last_seen_ms=now,
                        attributes=attrs,
                    )
                )
            held: dict[int, list[UpgradeReason]] = {}
            for (code, _kind), r in sorted(d.reasons.items()):
                if code not in active:
                    held.setdefault(code, []).append(r)
            for code, rs in held.items():
                out.append(
                    Fault(
                        source=SOURCE,
                        node=self.node_name,
                        device_type="NPU",
                        device_id=d.ids.phy,
                        code=self.engine.table.spelling(code) if code else HOT_RESET_FAILED,
                        level=max(r.level for r in rs).name,
                        first_seen_ms=min(r.time_ms for r in rs),
                        last_seen_ms=now,
                        attributes={
                            "logic_id": str(logic),
                            "upgrade": ",".join(sorted(r.kind for r in rs)),
                            "recovered": "true",
                            "plane": "network" if code in NETWORK_CODES_ALL else "chip",
                        },
                    )
                )
        return out

    def report(self) -> None:
        """Push the current view into the agent state (deltas go out on their own)."""
        self.state.replace_source(SOURCE, self.faults())
        sw = self.switch_state.faults(self.node_name)
        if self.resetting:  # §7: while a chip reset runs, switch codes are reported as NotHandle
            sw = [
                replace(f, level="NotHandle", attributes={**f.attributes, "during_reset": "true"}) for f in sw
            ]
        self.state.replace_source("lingqu", sw)
        for logic, d in self.engine.devices.items():
            spod = self.spod.get(logic, (-2, -2))
            worst = self.engine.worst_level(d)
            self.state.set_device(
                agent_pb2.DeviceState(
                    device_type="NPU",
                    device_id=logic,
                    phy_id=d.ids.phy,
                    health=d.health,
                    network_health=d.network_health,
                    level=worst.name if worst is not None else "",
                    super_pod_id=spod[0],
                    server_index=spod[1],
                )
            )
            self.health_gauge.labels(self.node_name, str(d.ids.phy)).set(1 if d.health == "Healthy" else 0)
            self.net_gauge.labels(self.node_name, str(d.ids.phy)).set(
                1 if d.network_health == "Healthy" else 0
            )
        if self.reset_writer is not None:
            chips = {
                d.ids.phy: ChipFault(
                    logic,
                    d.ids.phy,
                    self.engine.worst_level(d),
                    tuple(self.engine.table.spelling(c) for c in sorted(d.codes())),
                )
                for logic, d in self.engine.devices.items()
            }
            self.reset_writer.update(chips)
        self.last_report_ms = now_ms()
        if self.report_latency_hook is not None:
            pending, self._pending_latency = self._pending_latency, []
            self.report_latency_hook(pending, time.monotonic_ns())

    def _restore_state(self) -> None:
        if not self.args.state_file:
            return
        try:
            with open(self.args.state_file, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            event(log, logging.ERROR, "state file unreadable", path=self.args.state_file, error=str(e))
            return
        n = self.engine.import_state(data if isinstance(data, dict) else {})
        self._saved_state = json.dumps(self.engine.export_state(), sort_keys=True)
        event(log, logging.INFO, "escalations restored", path=self.args.state_file, reasons=n)

    def _save_state(self) -> None:
        if not self.args.state_file:
            return
        body = json.dumps(self.engine.export_state(), sort_keys=True)
        if body == self._saved_state:
            return
        try:
            Path(self.args.state_file).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(Path(self.args.state_file), body.encode())
            self._saved_state = body
        except OSError as e:
            self.call_errors[("state_file", "write failed")] += 1
            event(log, logging.ERROR, "state file write failed", path=self.args.state_file, error=str(e))

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

    # ---------------------------------------------------------------- control
    async def on_control(self, msg: agent_pb2.ControlMessage) -> None:
        """Handle control messages: ``job`` (JobInfo) -> chips in use and reset-config files."""
        kind = msg.WhichOneof("body")
        if kind != "job":
            return
        job = msg.job
        ranks = {r.rank: r.device_id for r in job.ranks if r.node == self.node_name}
        if job.deleted or not ranks:
            self.jobs_ranks.pop(job.job_id, None)
        else:
            self.jobs_ranks[job.job_id] = ranks
        if self.reset_writer is not None:
            self.reset_writer.set_job(job.job_id, job.name, job.namespace, ranks, job.deleted or not ranks)
        used_phy = {phy for rs in self.jobs_ranks.values() for phy in rs.values()}
        self.engine.set_in_use(logic for logic, d in self.engine.devices.items() if d.ids.phy in used_phy)
        event(log, logging.INFO, "job update", job=job.job_id, ranks_here=len(ranks), deleted=job.deleted)
        self.trigger.set()

    # ---------------------------------------------------------------- hot reset (§6)
    async def _hot_reset_step(self) -> None:
        for logic, d in self.engine.devices.items():
            if not d.chip and (0, HOT_RESET_FAILED) in d.reasons:
                del d.reasons[(0, HOT_RESET_FAILED)]  # the fault is gone: the escalation goes with it
                event(log, logging.INFO, "hot reset escalation cleared", logic_id=logic, phy_id=d.ids.phy)
        if not self.args.hot_reset:
            return
        now = self.monotonic()
        for logic, d in self.engine.devices.items():
            if logic in self.resetting:
                continue
            if d.health == "Healthy" or d.level not in HOT_RESET_LEVELS:
                if self.idle_since.pop(logic, None) is not None:
                    event(
                        log,
                        logging.INFO,
                        "hot reset not needed",
                        logic_id=logic,
                        health=d.health,
                        fault_level=d.level.name if d.level is not None else "",
                    )
                continue
            ids = self.ids[logic]
            try:
                procs = await self.call("procs", self.backend.process_count, ids)
            except (DcmiError, BlockingTimeout):
                procs = -1
            if procs != 0:  # the job's processes must have stopped (reference §6 gate)
                if self.idle_since.pop(logic, None) is not None:
                    event(
                        log,
                        logging.INFO,
                        "hot reset waiting",
                        logic_id=logic,
                        reason=f"{procs} processes on chip",
                    )
                continue
            if logic not in self.idle_since:
                event(
                    log,
                    logging.INFO,
                    "hot reset candidate",
                    logic_id=logic,
                    phy_id=ids.phy,
                    fault_level=d.level.name,
                    reason=f"idle, waiting {self.args.hot_reset_idle:.0f}s",
                )
            since = self.idle_since.setdefault(logic, now)
            if now - since < self.args.hot_reset_idle:
                continue
            bucket = self.reset_buckets[logic]
            while bucket and now - bucket[0] > 6 * 3600:
                bucket.popleft()
            if len(bucket) >= 3:
                self._reset_failed(logic, "reset budget of 3 per 6 h used")
                continue
            bucket.append(now)
            self.resetting.add(logic)
            d.resetting = True
            event(
                log,
                logging.WARNING,
                "hot reset start",
                logic_id=logic,
                phy_id=ids.phy,
                fault_level=d.level.name,
                reason=f"{d.level.name} and idle {now - since:.0f}s",
            )
            self.tasks.spawn(self._hot_reset(logic), name=f"hot-reset-{logic}")

    async def _hot_reset(self, logic: int) -> None:
        ids = self.ids[logic]
        try:
            try:
                health = await self.call("health", self.backend.health, ids)
            except DeviceNotReady:
                health = -8012
            if health == 0:
                event(log, logging.INFO, "hot reset skipped", logic_id=logic, reason="chip healthy again")
                return
            try:
                await self.call("reset", self.backend.reset, ids, timeout_s=30)
            except (DcmiError, BlockingTimeout) as e:
                self._reset_failed(logic, f"reset call failed: {e}")
                return
            deadline = self.monotonic() + self.args.hot_reset_boot_timeout
            while self.monotonic() < deadline:
                await asyncio.sleep(1)
                try:
                    if await self.call("boot", self.backend.boot_status, ids) == BOOT_START_FINISH:
                        self.engine.mark_reinit(logic)
                        self.idle_since.pop(logic, None)
                        event(log, logging.INFO, "hot reset done", logic_id=logic, phy_id=ids.phy)
                        self.trigger.set()
                        return
                except (DcmiError, BlockingTimeout):
                    continue
            self._reset_failed(logic, "boot not finished in time")
        finally:
            self.resetting.discard(logic)
            d = self.engine.devices.get(logic)
            if d is not None:
                d.resetting = False

    def _reset_failed(self, logic: int, why: str) -> None:
        d = self.engine.devices.get(logic)
        if d is None:
            return
        key = (0, HOT_RESET_FAILED)
        if key not in d.reasons:
            d.reasons[key] = UpgradeReason(0, NpuLevel.SeparateNPU, HOT_RESET_FAILED, self.engine.now())
            event(
                log,
                logging.ERROR,
                "hot reset failed",
                logic_id=logic,
                phy_id=d.ids.phy,
                reason=why,
                fault_level="SeparateNPU",
            )
        self.trigger.set()


def make_backend(args: argparse.Namespace):
    """Build the backend of ``--backend``. Raises ``DcmiError`` (e.g. LibraryMissing) for dcmi."""
    from deviced.backends import SimBackend, open_dcmi_backend

    if args.backend == "sim":
        return SimBackend(args.sim_cards, args.sim_devices_per_card)
    return open_dcmi_backend(
        args.dcmi_api,
        args.dcmi_lib,
        args.lingqu_lib,
        want_switch=not args.no_switch,
        hccn_tool=args.hccn_tool,
    )


async def print_device_info(args: argparse.Namespace, backend) -> int:
    """``--print-device-info``: one full poll and cycle, then the device-info document on stdout."""
    app = DeviceD(args, backend)
    app.loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(app.init_backend(), 30)
        await app.run_cycle()
        if getattr(backend, "switch", None) is not None and not args.no_switch:
            try:
                await app.call("lq_init", backend.switch.init)
                app.switch_state.replace(await app.call("lq_fault_info", backend.switch.fault_info))
            except (DcmiError, BlockingTimeout):
                pass
        print(deviceinfo.render_json(app))
        return 0
    except TimeoutError:
        event(log, logging.ERROR, "device listing timed out")
        return 1
    finally:
        app.blocking.shutdown()
        app.probe_pool.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Console script ``deviced``."""
    import socket

    args = config.parse(build_parser(), argv)
    fmlog.setup(args.log_level, args.log_file)
    if not args.node_name:
        args.node_name = socket.gethostname()
    try:
        backend = make_backend(args)
    except DcmiError as e:
        if args.print_device_info:
            event(log, logging.ERROR, "dcmi library unavailable", error=str(e))
            return 1
        # keep running: the agent stream reports DCMIUnavailable and loading is retried
        event(log, logging.ERROR, "dcmi library unavailable", error=str(e), action="retrying every 5 s")
        backend = None
    try:
        FaultCodeTable.load(args.fault_code_file)
        Customization.load(args.fault_customization_file)
        SwitchFaultTable.load(args.switch_fault_code_file)
    except TableError as e:
        event(log, logging.ERROR, "fault table unusable", error=str(e))
        return 2

    async def _main(stop: asyncio.Event) -> int:
        if args.print_device_info:
            return await print_device_info(args, backend)
        try:
            app = DeviceD(args, backend)
        except (OSError, TableError) as e:  # unreadable TLS files, tables changed since the check
            event(log, logging.ERROR, "deviced failed to start", error=str(e))
            return 1
        sim_http = None
        try:
            if args.backend == "sim":
                from deviced import simapi

                if args.sim_control_addr:
                    sim_http = HttpServer(args.sim_control_addr, CollectorRegistry())
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
            "deviced listening",
            http=f"{app.http.host}:{app.http.port}",
            node=args.node_name,
            backend=args.backend,
        )
        await stop.wait()
        await app.stop()
        if sim_http is not None:
            await sim_http.stop()
        return 0

    return runtime.run(_main)
