"""The BMC source: polls the BMC over IPMI and keeps the node's hardware faults and status current.

Source: issue 3 "BMC access", issue 12 (one source model), reference noded.md §1–3, design.md
"Deliberate differences".

- Mode ``auto`` (default): Get Device ID; a Huawei BMC (manufacturer 2011) is read with the iBMC
  OEM alarm command, any other with the SEL. A Huawei BMC that rejects the OEM command (an old
  iBMC) falls back to the SEL, and the OEM query is tried again every ``oem_retry_s`` (600 s); a
  transient code (0xD5 "not in present state", busy, timeout) is a rejected poll, retried with the
  backoff, and only ``TRANSIENT_STRIKES`` in a row fall back (then the OEM query is retried at the
  next poll). Back on OEM the SEL-derived faults are dropped. ``oem`` / ``sel`` force one path.
- Each OEM poll replaces the node's ``bmc-oem`` fault set; SEL events assert/deassert ``bmc-sel``
  faults (see :mod:`noded.bmc.sel`). Codes are levelled by the NodeD level table
  (``--levels-file``, re-read when it changes: :class:`noded.levels.LevelTableWatcher`, owned by this
  source); unknown codes are NotHandleFault with attribute ``unknown=true`` and counted.
- Node status = worst level over the BMC faults: Healthy / PreSeparate / UnHealthy.
- pyghmi blocks: one poll is one call in the bounded pool (``ctx.run_blocking``) with ``timeout_s``.
- A failed poll keeps the previous faults and sets condition ``BMCUnreachable`` (timeout, no answer,
  login refused, previous call still hanging) or ``BMCUnsupported`` (completion code meaning the
  command is not supported); a bad reply is a counted rejection. The BMC is retried with
  :class:`faultmesh.retry.Backoff` from ``backoff_base_s`` capped at the poll period, forever (the
  reference gives up after three tries). Successful polls start at a fixed rate.
- Without ``--bmc-host`` the source reports the node Healthy with condition ``BMCUnreachable``
  (reason ``NotConfigured``) and polls nothing.

The source writes the two fault sources ``bmc-oem`` / ``bmc-sel`` and the node status into the
agent state (``ctx.state``), so its own name ``bmc`` is only its metrics label and config key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from faultmesh import config
from faultmesh.config import number_in
from faultmesh.levels import NodeLevel
from faultmesh.log import RateLimitedLog, event
from faultmesh.model import now_ms
from faultmesh.retry import Backoff
from faultmesh.runtime import BlockingTimeout
from faultmesh.source import PolledSource, SourceContext
from faultmesh.statefile import JsonStateFile
from noded.bmc import faults, oem, sel
from noded.bmc.client import (
    HUAWEI_MANUFACTURER_ID,
    BmcAuthError,
    BmcBusy,
    BmcClient,
    BmcCommandError,
    BmcError,
)
from noded.bmc.faults import SOURCE_OEM, SOURCE_SEL, PollResult
from noded.bmc.firstseen import FirstSeen
from noded.bmc.sel import load_sel_table
from noded.levels import LevelTable, LevelTableWatcher, node_status
from noded.metrics import NodedMetrics
from noded.sections import BmcConfig

log = logging.getLogger("noded.bmc")

COND_UNREACHABLE = "BMCUnreachable"
COND_UNSUPPORTED = "BMCUnsupported"
MODES = ("auto", "oem", "sel")
LOGOUT_TIMEOUT_S = 3.0
OEM_RETRY_S = 600.0  # after a fallback to the SEL, try the OEM alarms again this often
TRANSIENT_STRIKES = 3  # transient completion codes in a row before falling back


def read_password(cfg: Any) -> str:
    """The BMC password from ``--bmc-password-file`` or env ``FAULTMESH_BMC_PASSWORD``. Raises
    ``ValueError`` without it (the value itself is never logged)."""
    pw = config.read_secret(cfg.bmc_password_file, "FAULTMESH_BMC_PASSWORD", "--bmc-password-file")
    if not pw:
        raise ValueError("a BMC host needs --bmc-password-file or env FAULTMESH_BMC_PASSWORD")
    return pw


class Bmc(PolledSource):
    """The BMC source (module doc). Build with :meth:`from_config` (noded) or the keyword arguments
    (tests); ``levels()`` returns the current :class:`LevelTable`; ``client=None``: no BMC.

    Injectable for tests: ``clock`` (monotonic s), ``sleep`` (async s), ``wall_ms`` (epoch ms). A test
    may set ``ctx`` without :meth:`start` and call :meth:`poll_once` / :meth:`run` itself.
    """

    name = "bmc"
    fault_sources = (SOURCE_OEM, SOURCE_SEL)
    Config = BmcConfig  # its section (noded.sources.config_section)

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        """The BMC and level-table flags (``--bmc-*``, ``--poll-interval``, ``--levels-*``, ...)."""
        p.add_argument("--bmc-host", help="BMC address; empty: run without a BMC")
        p.add_argument("--bmc-port", type=int, default=623, help="BMC IPMI UDP port")
        p.add_argument("--bmc-user", default="admin")
        p.add_argument(
            "--bmc-password-file", help="file with the BMC password (else env FAULTMESH_BMC_PASSWORD)"
        )
        p.add_argument(
            "--bmc-mode",
            choices=MODES,
            default="auto",
            help="auto: Huawei iBMC OEM alarms when the BMC is Huawei, else the SEL",
        )
        p.add_argument(
            "--bmc-timeout", type=number_in(float, 0.5, 600), default=15.0, help="timeout of one BMC poll (s)"
        )
        p.add_argument(
            "--poll-interval", type=number_in(float, 1, 600), default=60.0, help="BMC poll period (s), 1..600"
        )
        p.add_argument(
            "--bmc-call-timeout-max",
            type=number_in(float, 0.5, 600),
            default=5.0,
            help="timeout of one IPMI call, at most (s; the call timeout is min(this, --bmc-timeout))",
        )
        p.add_argument(
            "--backoff-base", type=number_in(float, 0.1, 600), default=1.0, help="first BMC retry delay (s)"
        )
        p.add_argument(
            "--levels-file", help="fault level table in NodeDConfiguration.json format (reloaded on change)"
        )
        p.add_argument(
            "--levels-check-interval", type=float, default=5.0, help="how often to look for a new table (s)"
        )
        p.add_argument("--sel-events-file", help="SEL event -> fault table (JSON), default: noded's own")
        p.add_argument("--bmc-state-file", help="keeps BMC faults' first-seen times across restarts")

    @classmethod
    def from_config(cls, cfg: BmcConfig, metrics: NodedMetrics) -> Bmc:
        """The source for noded's flags ``cfg`` (its section). Raises ``ValueError`` (no password,
        bad SEL table) or ``OSError`` (unreadable SEL table file)."""
        watcher = LevelTableWatcher(
            cfg.levels_file,
            on_reject=lambda reason: metrics.level_reloads.labels(reason).inc(),
        )
        client = None
        if cfg.bmc_host:
            client = BmcClient(
                cfg.bmc_host,
                cfg.bmc_port,
                cfg.bmc_user,
                read_password(cfg),
                timeout_s=min(cfg.bmc_call_timeout_max, cfg.bmc_timeout),
            )
        src = cls(
            client=client,
            levels=lambda: watcher.table,
            sel_table=load_sel_table(cfg.sel_events_file),
            metrics=metrics,
            poll_interval_s=cfg.poll_interval,
            timeout_s=cfg.bmc_timeout,
            mode=cfg.bmc_mode,
            backoff_base_s=cfg.backoff_base,
        )
        src.watcher = watcher
        rejected = metrics.state_file_rejected
        src.first_seen = FirstSeen(JsonStateFile(cfg.bmc_state_file, log, lambda r: rejected.labels(r).inc()))
        src.levels_check_interval_s = cfg.levels_check_interval
        watcher.on_change = src._levels_changed
        return src

    def __init__(
        self,
        *,
        client: BmcClient | None,
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
        oem_retry_s: float = OEM_RETRY_S,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"bmc mode must be one of {MODES}, got {mode!r}")
        super().__init__()
        self.client = client
        self.levels = levels
        self.sel_table = sel_table
        self.metrics = metrics
        self.poll_interval_s = self.interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.configured_mode = mode
        self.mode: str | None = None if mode == "auto" else mode
        self.backoff_base_s = backoff_base_s
        self.oem_retry_s = oem_retry_s
        self._oem_retry_at: float | None = None  # set while on the SEL after a fallback
        self._transient_strikes = 0
        # no jitter: the retry schedule is the documented 1, 2, 4, ... s capped at the poll period
        self.backoff = Backoff(min(backoff_base_s, poll_interval_s), poll_interval_s, jitter_s=0.0)
        self._retry_s = self.backoff.initial_s
        self.clock = clock
        self.sleep = sleep
        self.wall_ms = wall_ms
        self.watcher: LevelTableWatcher | None = None
        self.levels_check_interval_s = 5.0
        self.serial_number = ""  # the server's serial number from a Huawei iBMC (node SN)
        self.on_serial: Callable[[str], None] = lambda sn: None
        self.alarms: list[oem.AlarmRecord] = []
        self.cursor = sel.SelCursor()
        self.tracker = sel.SelFaultTracker()
        self._known_unknown: set[tuple[str, str, int, str]] = set()
        self._ratelog = RateLimitedLog(log, period_s=300.0, clock=clock)
        self.first_seen = FirstSeen(JsonStateFile(None, log))  # --bmc-state-file (see noded.bmc.firstseen)

    @property
    def state(self):
        """The agent state (:class:`faultmesh.agent.AgentState`) of the context."""
        assert self.ctx is not None, "Bmc used before start() / without ctx"
        return self.ctx.state

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self, ctx: SourceContext) -> None:
        """Publish the current (empty) state, start the poll loop and the level-table watcher; without
        a BMC report the node Healthy with ``BMCUnreachable``/``NotConfigured``."""
        self.ctx = ctx
        ctx.bind_loop()
        self.first_seen.load()
        if self.client is None:
            ctx.state.set_node_status("Healthy")
            ctx.set_condition(COND_UNREACHABLE, True, "NotConfigured", "noded runs without --bmc-host")
            self.polled.set()
            return
        ctx.mark_pending(*self.fault_sources)  # ClusterD keeps its BMC faults until the first poll
        self.publish()  # the node status is reported even before the first poll
        ctx.spawn(self.run(), name="bmc-poll")
        if self.watcher is not None and self.watcher.path:
            ctx.spawn(self.watcher.run(self.levels_check_interval_s), name="levels-watch")

    async def stop(self) -> None:
        """Cancel the loops, then log out of the BMC (in the pool, bounded); a hung call is left alone."""
        await super().stop()
        if self.ctx is not None and self.client is not None and not self.client.busy:
            with contextlib.suppress(Exception):
                await self.ctx.run_blocking(LOGOUT_TIMEOUT_S, self.client.close)

    def _levels_changed(self, table: LevelTable) -> None:
        self.metrics.level_reloads.labels("ok").inc()
        if self.ctx is not None and self.client is not None:
            self.publish()

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
        row ``backoff_base_s * 2**(n-1)`` capped at the poll period (:class:`Backoff`, no jitter)."""
        return self.poll_interval_s if ok else self._retry_s

    async def poll_once(self) -> bool:
        """One poll. Returns True on success; failures are counted, logged and set conditions."""
        t0 = self.clock()
        mode_label = self.mode or "auto"
        mode = self.mode
        if self._oem_retry_at is not None and t0 >= self._oem_retry_at:
            mode = "oem"  # after a fallback: is the OEM command back?
            self._oem_retry_at = t0 + self.oem_retry_s  # until this attempt says otherwise
        try:
            result = await self.ctx.run_blocking(self.timeout_s, self._blocking_poll, mode, self.cursor)
        except BlockingTimeout:
            return self._failed(
                "timeout", COND_UNREACHABLE, "Timeout", f"no answer within {self.timeout_s}s", t0, mode_label
            )
        except BmcBusy as e:
            return self._failed("busy", COND_UNREACHABLE, "Busy", str(e), t0, mode_label)
        except BmcAuthError as e:
            return self._failed("auth", COND_UNREACHABLE, "AuthFailed", str(e), t0, mode_label)
        except BmcCommandError as e:
            if e.transient:  # "not now": keep the state, retry with the backoff
                self._transient_strikes += 1
                return self._rejected("completion-code", str(e), t0, mode_label)
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
            fallback = transient = False
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
                    if e.transient and self._transient_strikes + 1 < TRANSIENT_STRIKES:
                        raise
                    fallback = True
                    transient = e.transient
                else:
                    if not self.serial_number:
                        try:
                            res.serial = self.client.serial_number()
                        except BmcCommandError:
                            res.serial = ""
                    return res
            res = PollResult("sel")
            res.fallback, res.transient = fallback, transient
            res.records, res.cursor, res.cleared = sel.read_new_records(self.client.raw, cursor)
            return res

    # -- outcomes ----------------------------------------------------------------------------------
    def _count_failure(self, kind: str, message: str, t0: float, mode: str, result: str) -> None:
        self.metrics.poll_duration.labels(mode).observe(max(0.0, self.clock() - t0))
        self.metrics.polls.labels(result).inc()
        self.metrics.bmc_errors.labels(kind).inc()
        self.failures += 1
        self._retry_s = self.backoff.next_delay()
        self.last_error = f"{kind}: {message}"
        self.up = False
        if self.ctx is not None and self.ctx.metrics is not None:
            self.ctx.metrics.up.labels(self.name).set(0)

    def _failed(self, kind: str, cond: str, reason: str, message: str, t0: float, mode: str) -> bool:
        self._count_failure(kind, message, t0, mode, "failed")
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
        self._count_failure(kind, message, t0, mode, "rejected")
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
        self._transient_strikes = 0
        self.backoff.reset()
        self.last_error = ""
        self.polls_ok += 1
        self.up = True
        if self.ctx is not None and self.ctx.metrics is not None:
            self.ctx.metrics.up.labels(self.name).set(1)
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
            if res.mode == "oem" and self._oem_retry_at is not None:
                event(log, logging.INFO, "bmc oem alarms back, leaving the sel", host=self.client.host)
                self.tracker, self.cursor = sel.SelFaultTracker(), sel.SelCursor()
            self.mode = res.mode
        if res.fallback:
            self._oem_retry_at = self.clock() + (self.poll_interval_s if res.transient else self.oem_retry_s)
        elif res.mode == "oem":
            self._oem_retry_at = None
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
        self.first_seen.polled(f for k, f in self.state.faults.items() if k.source in self.fault_sources)
        if self.ctx is not None:
            self.ctx.mark_ready(*self.fault_sources)
        self.polled.set()

    # -- faults --------------------------------------------------------------------------------------
    def publish(self) -> None:
        """Push the current BMC faults and node status into the agent state (re-levelled with the
        current table; also called when the level table changes)."""
        table = self.levels()
        now, node = self.wall_ms(), self.state.node
        oem_faults = self.first_seen.apply(faults.oem_faults(self.alarms, table, node, now))
        sel_faults = self.first_seen.apply(faults.sel_faults(self.tracker, table, node, now))
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
