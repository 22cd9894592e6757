"""The BMC monitor: polls the BMC over IPMI and keeps the node's hardware faults and status current.

Source: issue 3 "BMC access", reference noded.md §1–3, design.md "Deliberate differences".

- Mode ``auto`` (default): Get Device ID; a Huawei BMC (manufacturer 2011) is read with the iBMC
  OEM alarm command, any other with the SEL. A Huawei BMC that rejects the OEM command (an old
  iBMC) falls back to the SEL. ``oem`` / ``sel`` force one path.
- Each OEM poll replaces the node's ``bmc-oem`` fault set; SEL events assert/deassert ``bmc-sel``
  faults (see :mod:`noded.bmc.sel`). Codes are levelled by the NodeD level table; unknown codes
  are NotHandleFault with attribute ``unknown=true`` and counted.
- Node status = worst level over the BMC faults: Healthy / PreSeparate / UnHealthy.
- pyghmi blocks: one poll is one call in the :class:`BlockingPool` with ``timeout_s``.
- A failed poll keeps the previous faults and sets condition ``BMCUnreachable`` (timeout, no answer,
  login refused, previous call still hanging) or ``BMCUnsupported`` (completion code meaning the
  command is not supported); a bad reply is a counted rejection. The BMC is retried with
  exponential backoff from ``backoff_base_s`` capped at the poll period, forever (the reference
  gives up after three tries).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from faultmesh.agent import AgentState
from faultmesh.levels import NodeLevel
from faultmesh.log import RateLimitedLog, event
from faultmesh.model import Fault, now_ms
from faultmesh.runtime import BlockingPool, BlockingTimeout
from noded.bmc import oem, sel
from noded.bmc.client import (
    HUAWEI_MANUFACTURER_ID,
    BmcAuthError,
    BmcBusy,
    BmcClient,
    BmcCommandError,
    BmcError,
)
from noded.levels import LevelTable, node_status
from noded.metrics import NodedMetrics

log = logging.getLogger("noded.bmc")

SOURCE_OEM = "bmc-oem"
SOURCE_SEL = "bmc-sel"
COND_UNREACHABLE = "BMCUnreachable"
COND_UNSUPPORTED = "BMCUnsupported"
MODES = ("auto", "oem", "sel")


class PollResult:
    """What one blocking poll returned (built in the pool thread, applied on the loop)."""

    __slots__ = ("mode", "fallback", "alarms", "records", "cursor", "cleared", "device", "serial")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.fallback = False
        self.alarms: list[oem.AlarmRecord] = []
        self.records: list[sel.SelRecord] = []
        self.cursor: sel.SelCursor | None = None
        self.cleared = False
        self.device: Any = None
        self.serial: str | None = None


class BmcMonitor:
    """Polls one BMC forever. ``levels()`` returns the current :class:`LevelTable`.

    Injectable for tests: ``clock`` (monotonic s), ``sleep`` (async s), ``wall_ms`` (epoch ms).
    """

    def __init__(
        self,
        *,
        state: AgentState,
        client: BmcClient,
        pool: BlockingPool,
        levels: Callable[[], LevelTable],
        sel_table: sel.SelEventTable,
        metrics: NodedMetrics,
        poll_interval_s: float = 60.0,
        timeout_s: float = 15.0,
        mode: str = "auto",
        backoff_base_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall_ms: Callable[[], int] = now_ms,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"bmc mode must be one of {MODES}, got {mode!r}")
        self.state = state
        self.client = client
        self.pool = pool
        self.levels = levels
        self.sel_table = sel_table
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.configured_mode = mode
        self.mode: str | None = None if mode == "auto" else mode
        self.backoff_base_s = backoff_base_s
        self.clock = clock
        self.sleep = sleep
        self.wall_ms = wall_ms
        self.failures = 0
        self.polls_ok = 0
        self.serial_number = ""  # the server's serial number from a Huawei iBMC (node SN)
        self.on_serial: Callable[[str], None] = lambda sn: None
        self.last_error = ""
        self.alarms: list[oem.AlarmRecord] = []
        self.cursor = sel.SelCursor()
        self.tracker = sel.SelFaultTracker()
        self._known_unknown: set[tuple[str, str, int, str]] = set()
        self._ratelog = RateLimitedLog(log, period_s=300.0, clock=clock)
        self.polled = asyncio.Event()  # set after every poll attempt (tests, --print-node-info)

    # -- loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Poll forever (cancel to stop): successful polls start every ``poll_interval_s`` (fixed
        rate; a poll longer than the period is followed at once by the next), failed ones are
        retried after ``next_delay``."""
        while True:
            started = self.clock()
            ok = await self.poll_once()
            delay = self.next_delay(ok)
            if ok:
                delay = max(0.0, delay - (self.clock() - started))
            await self.sleep(delay)

    def next_delay(self, ok: bool) -> float:
        """Seconds until the next poll: the poll period after success; after the n-th failure in a
        row ``backoff_base_s * 2**(n-1)`` capped at the poll period."""
        if ok:
            return self.poll_interval_s
        n = max(self.failures, 1)
        return min(self.backoff_base_s * (2 ** min(n - 1, 30)), self.poll_interval_s)

    async def poll_once(self) -> bool:
        """One poll. Returns True on success; failures are counted, logged and set conditions."""
        t0 = self.clock()
        mode_label = self.mode or "auto"
        try:
            result = await self.pool.call(self.timeout_s, self._blocking_poll, self.mode, self.cursor)
        except BlockingTimeout:
            return self._failed(
                "timeout", COND_UNREACHABLE, "Timeout", f"no answer within {self.timeout_s}s", t0, mode_label
            )
        except BmcBusy as e:
            return self._failed("busy", COND_UNREACHABLE, "Busy", str(e), t0, mode_label)
        except BmcAuthError as e:
            return self._failed("auth", COND_UNREACHABLE, "AuthFailed", str(e), t0, mode_label)
        except BmcCommandError as e:
            if e.unsupported:
                reason = {oem.NETFN: "OemAlarmsUnsupported", sel.NETFN_STORAGE: "SelUnsupported"}.get(
                    e.netfn, "CommandUnsupported"
                )
                return self._failed("completion-code", COND_UNSUPPORTED, reason, str(e), t0, mode_label)
            return self._rejected("completion-code", str(e), t0, mode_label)
        except BmcError as e:
            return self._failed(e.kind, COND_UNREACHABLE, "Unreachable", str(e), t0, mode_label)
        except oem.OemReplyError as e:
            return self._rejected(f"oem-{e.reason}", str(e), t0, mode_label)
        except sel.SelError as e:
            return self._rejected(f"sel-{e.reason}", str(e), t0, mode_label)
        except Exception as e:  # a bug in parsing must not end the monitor
            event(log, logging.ERROR, "bmc poll crashed", error=repr(e))
            return self._rejected("internal", repr(e), t0, mode_label)
        self.metrics.poll_duration.labels(result.mode).observe(max(0.0, self.clock() - t0))
        self._succeeded(result)
        return True

    def _blocking_poll(self, mode: str | None, cursor: sel.SelCursor) -> PollResult:
        """Runs in the pool thread: detect the mode when needed, read alarms or new SEL records."""
        with self.client.locked():
            fallback = False
            if mode is None:
                dev = self.client.device_id()
                mode = "oem" if dev.manufacturer_id == HUAWEI_MANUFACTURER_ID else "sel"
            if mode == "oem":
                try:
                    res = PollResult("oem")
                    res.alarms = self.client.oem_alarms()
                except BmcCommandError as e:
                    if not (e.unsupported and self.configured_mode == "auto"):
                        raise
                    fallback = True
                else:
                    if not self.serial_number:
                        try:
                            res.serial = self.client.serial_number()
                        except BmcCommandError:
                            res.serial = ""
                    return res
            res = PollResult("sel")
            res.fallback = fallback
            res.records, res.cursor, res.cleared = sel.read_new_records(self.client.raw, cursor)
            return res

    # -- outcomes ----------------------------------------------------------------------------------
    def _failed(self, kind: str, cond: str, reason: str, message: str, t0: float, mode: str) -> bool:
        self.metrics.poll_duration.labels(mode).observe(max(0.0, self.clock() - t0))
        self.metrics.polls.labels("failed").inc()
        self.metrics.bmc_errors.labels(kind).inc()
        self.failures += 1
        self.last_error = f"{kind}: {message}"
        other = COND_UNSUPPORTED if cond == COND_UNREACHABLE else COND_UNREACHABLE
        changed = self.state.set_condition(cond, True, reason, message)
        if other in self.state.conditions:
            self.state.set_condition(other, False)
        if changed:
            event(
                log,
                logging.WARNING,
                "bmc poll failed",
                kind=kind,
                reason=reason,
                error=message,
                host=self.client.host,
                port=self.client.port,
                retry_s=self.next_delay(False),
            )
        else:
            self._ratelog.warning(
                kind, "bmc poll failed", error=message, host=self.client.host, failures=self.failures
            )
        self.polled.set()
        return False

    def _rejected(self, kind: str, message: str, t0: float, mode: str) -> bool:
        self.metrics.poll_duration.labels(mode).observe(max(0.0, self.clock() - t0))
        self.metrics.polls.labels("rejected").inc()
        self.metrics.bmc_errors.labels(kind).inc()
        self.failures += 1
        self.last_error = f"{kind}: {message}"
        # the BMC answered: it is reachable; the previous fault set stays
        self.state.set_condition(COND_UNREACHABLE, False)
        self._ratelog.warning(
            kind,
            "bmc reply rejected",
            error=message,
            host=self.client.host,
            kept_faults=self._bmc_fault_count(),
        )
        self.polled.set()
        return False

    def _succeeded(self, res: PollResult) -> None:
        self.metrics.polls.labels("ok").inc()
        self.metrics.last_success.set(time.time())
        if self.failures:
            event(
                log, logging.INFO, "bmc reachable again", host=self.client.host, after_failures=self.failures
            )
        self.failures = 0
        self.last_error = ""
        self.polls_ok += 1
        if self.mode != res.mode:
            event(
                log,
                logging.INFO,
                "bmc mode selected",
                mode=res.mode,
                fallback=res.fallback,
                host=self.client.host,
            )
            if res.fallback:
                event(
                    log,
                    logging.WARNING,
                    "bmc oem alarms unsupported, reading the sel instead",
                    host=self.client.host,
                )
            self.mode = res.mode
        self.state.set_condition(COND_UNREACHABLE, False)
        self.state.set_condition(COND_UNSUPPORTED, False)
        if res.serial:
            self.serial_number = res.serial
            event(log, logging.INFO, "node serial number read", serial=res.serial)
            self.on_serial(res.serial)
        if res.mode == "oem":
            self.alarms = res.alarms
        else:
            counts = self.tracker.apply(self.sel_table, res.records, res.cleared)
            for k, v in counts.items():
                if v:
                    self.metrics.sel_records.labels(k).inc(v)
            if counts["unknown_type"]:
                self._ratelog.warning(
                    "sel-unknown-type", "sel records of unknown type skipped", count=counts["unknown_type"]
                )
            if res.cleared:
                event(log, logging.INFO, "bmc sel cleared", host=self.client.host)
            if res.cursor is not None:
                self.cursor = res.cursor
        self.publish()
        self.polled.set()

    # -- faults --------------------------------------------------------------------------------------
    def oem_faults(self, table: LevelTable) -> list[Fault]:
        """Current OEM alarms as faults (one per device and code, first occurrence wins)."""
        now = self.wall_ms()
        out: dict[tuple[str, int, str], Fault] = {}
        for a in self.alarms:
            key = (a.device_type, a.device_id, a.code)
            if key in out:
                continue
            level, known = table.classify(a.code)
            attrs = {"severity": str(a.severity), "type_byte": f"0x{a.type_byte:02X}"}
            if not known:
                attrs["unknown"] = "true"
            out[key] = Fault(
                SOURCE_OEM,
                self.state.node,
                a.device_type,
                a.device_id,
                a.code,
                level.name,
                first_seen_ms=now,
                last_seen_ms=now,
                attributes=attrs,
            )
        return list(out.values())

    def sel_faults(self, table: LevelTable) -> list[Fault]:
        """Active SEL faults. The SEL table gives the level; a level-table entry for the code wins."""
        now = self.wall_ms()
        out = []
        for (dtype, num, code), (rule, bmc_ts) in self.tracker.active.items():
            level, known = table.classify(code)
            lv = level if known else rule.level
            attrs = {"event": rule.name, "sensor_type": f"0x{rule.sensor_type:02X}", "bmc_time": str(bmc_ts)}
            out.append(
                Fault(
                    SOURCE_SEL,
                    self.state.node,
                    dtype,
                    num,
                    code,
                    lv.name,
                    first_seen_ms=now,
                    last_seen_ms=now,
                    attributes=attrs,
                )
            )
        return out

    def publish(self) -> None:
        """Push the current BMC faults and node status into the agent state (re-levelled with the
        current table; also called when the level table changes)."""
        table = self.levels()
        oem_faults = self.oem_faults(table)
        sel_faults = self.sel_faults(table)
        for f in oem_faults:
            if f.attributes.get("unknown") and f.key not in self.state.faults:
                k = (f.device_type, f.code, f.device_id, f.source)
                if k not in self._known_unknown:
                    self.metrics.unknown_codes.inc()
                    event(
                        log,
                        logging.WARNING,
                        "unknown fault code",
                        code=f.code,
                        device_type=f.device_type,
                        device_id=f.device_id,
                    )
        self._known_unknown = {
            (f.device_type, f.code, f.device_id, f.source) for f in oem_faults if f.attributes.get("unknown")
        }
        changed = self.state.replace_source(SOURCE_OEM, oem_faults)
        changed |= self.state.replace_source(SOURCE_SEL, sel_faults)
        all_faults = oem_faults + sel_faults
        for src in (SOURCE_OEM, SOURCE_SEL):
            for lv in NodeLevel:
                self.metrics.faults.labels(src, lv.name).set(
                    sum(1 for f in all_faults if f.source == src and f.level == lv.name)
                )
        status = node_status(NodeLevel[f.level] for f in all_faults)
        old = self.state.node_status
        if self.state.set_node_status(status):
            event(log, logging.INFO, "node status changed", old=old or "-", new=status)
        self.metrics.set_node_status(status)
        if changed:
            event(log, logging.INFO, "bmc faults changed", faults=len(all_faults), status=status)

    def _bmc_fault_count(self) -> int:
        return sum(1 for k in self.state.faults if k.source in (SOURCE_OEM, SOURCE_SEL))
