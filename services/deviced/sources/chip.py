"""Chip fault events (reference deviced.md §1.1): the DCMI subscription with its C-callback bridge and
its polling fallback (mend), and the card-drop check.

Callbacks arrive on the driver's C thread: a token bucket (``--callback-rate-limit`` per minute,
default 1000) is taken right there; accepted events are queued and handed to the loop with one
``ctx.from_thread`` per batch; an overflow drops the event, counts it and puts the chip in the re-init
set (re-polled next cycle). Nothing calls DCMI from the callback.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from deviced.chipio import CALL_ERRORS
from deviced.engine import DeviceEvent
from deviced.sources.base import Deps
from faultmesh import log as fmlog
from faultmesh.dcmi.api import DevFaultEvent
from faultmesh.log import event
from faultmesh.ratelimit import TokenBucket
from faultmesh.source import PushSource, SourceContext

log = logging.getLogger("deviced")

SUBSCRIBE_TRIES = 3  # §1.1: 3 tries, 1 s apart


def callback_bucket(per_minute: int, clock: Callable[[], float] = time.monotonic) -> TokenBucket:
    """The callback limiter: ``per_minute`` tokens per minute, a burst of ``per_minute`` (clock in s)."""
    return TokenBucket(per_minute / 60.0, float(per_minute), clock=clock)


async def subscribe_tries(
    attempt_fn: Callable[[], Awaitable[None]], pause_s: float, failed_phrase: str
) -> int | None:
    """Try ``attempt_fn`` up to 3 times, ``pause_s`` s apart (§1.1); each failure (``DcmiError`` or a
    timeout) is logged as ``failed_phrase``. Returns the attempt that worked, or None."""
    for attempt in range(1, SUBSCRIBE_TRIES + 1):
        try:
            await attempt_fn()
            return attempt
        except CALL_ERRORS as e:
            event(log, logging.WARNING, failed_phrase, attempt=attempt, error=str(e))
            await asyncio.sleep(pause_s)
    return None


class CardDrop(PushSource):
    """Health -8012 of each chip, read every cycle while events come by subscription (while polling,
    the mend poll reads health with the codes): 40F84E00 occurs / recovers in the engine."""

    name = "card-drop"
    fault_sources = ()  # the engine's sink reports (and readies) dcmi / lingqu

    def __init__(self, deps: Deps) -> None:
        super().__init__()
        self.deps = deps

    async def on_cycle(self) -> None:
        """One health read per chip (skipped unless subscribed)."""
        eng, io = self.deps.engine, self.deps.io
        if not eng.subscribed:
            return
        for logic, ids in io.ids.items():
            dropped = await io.health(ids)
            if dropped is not None:
                eng.set_card_drop(logic, dropped)


class ChipEvents(PushSource):
    """DCMI fault events: subscription + C bridge (see module docstring), and mend polling each cycle
    (re-init chips, all chips once the subscription failed, chips unhealthy > 5 min; §1.1).

    Counters: ``callbacks`` (received), ``callback_drops`` (token bucket). ``latency`` collects
    accepted (event, monotonic ns) while ``track_latency`` is set (the storm bench)."""

    name = "chip-events"
    fault_sources = ()  # the engine's sink reports (and readies) dcmi / lingqu

    def __init__(self, deps: Deps) -> None:
        super().__init__()
        self.deps = deps
        self.subscribe_retry_s = 1.0
        self.callbacks = 0
        self.callback_drops = 0
        self.track_latency = False
        self.latency: list[tuple[DevFaultEvent, int]] = []
        self.bucket = callback_bucket(deps.args.callback_rate_limit)
        self._lock = threading.Lock()
        self._queue: list[tuple[DevFaultEvent, int]] = []
        self._overflow: set[int] = set()
        self._scheduled = False
        self._ratelog = fmlog.RateLimitedLog(log, 10.0)

    async def start(self, ctx: SourceContext) -> None:
        """Bind the loop for callbacks, then subscribe (or downgrade to polling)."""
        await super().start(ctx)
        await self.subscribe()

    async def subscribe(self) -> None:
        """Subscribe to chip fault events: 3 tries, 1 s apart (§1.1); failure -> polling for good."""
        args, eng, io = self.deps.args, self.deps.engine, self.deps.io
        if args.no_subscribe:
            self._downgrade("subscription disabled by flag")
            return
        assert io.backend is not None
        backend = io.backend

        async def once() -> None:
            await io.call("subscribe", backend.subscribe, self.on_c_event)

        attempt = await subscribe_tries(once, self.subscribe_retry_s, "fault subscription failed")
        if attempt is None:
            self._downgrade("subscribe failed 3 times")
            return
        eng.set_subscription(True)
        event(log, logging.INFO, "fault subscription up", attempt=attempt)

    def _downgrade(self, why: str) -> None:
        self.deps.engine.set_subscription(False)
        event(log, logging.WARNING, "fault get mode downgrade", cause=why)

    # -- the C thread ---------------------------------------------------------------------------
    def on_c_event(self, ev: DevFaultEvent) -> None:
        """Runs on the driver's thread: token bucket, queue, one wake-up per batch. Never calls DCMI."""
        t = time.monotonic_ns()
        with self._lock:
            self.callbacks += 1
            if self.bucket.take():
                self._queue.append((ev, t))
            else:
                self.callback_drops += 1
                self._overflow.add(ev.logic_id)
            if self._scheduled or self.ctx is None:
                return
            self._scheduled = True
        self.ctx.from_thread(self.drain)

    def drain(self) -> None:
        """On the loop: hand the queued callbacks to the engine (overflowed chips re-polled)."""
        with self._lock:
            batch, self._queue = self._queue, []
            overflow, self._overflow = self._overflow, set()
            self._scheduled = False
        eng = self.deps.engine
        now = eng.now()
        for ev, _t in batch:
            event(
                log,
                logging.DEBUG,
                "receive devFaultInfo",
                logic_id=ev.logic_id,
                code=f"{ev.event_id:08X}",
                assertion=ev.assertion,
                severity=ev.severity,
            )
            eng.submit(DeviceEvent(ev.logic_id, ev.event_id, ev.assertion, ev.severity, now, "callback"))
        for logic in overflow:
            eng.overflowed(logic)
        if overflow:
            self._ratelog.warning(
                "callback-overflow",
                "callback rate limit overflow",
                devices=len(overflow),
                dropped=self.callback_drops,
            )
        if self.track_latency:
            self.latency.extend(batch)
        self.deps.wake_urgent()

    def take_latency(self) -> list[tuple[DevFaultEvent, int]]:
        """The (event, callback monotonic ns) accepted since the last call."""
        out, self.latency = self.latency, []
        return out

    # -- polling fallback (mend) -------------------------------------------------------------------
    async def on_cycle(self) -> None:
        """Poll the error codes (and health) of every chip the engine says needs mending."""
        eng, io = self.deps.engine, self.deps.io
        for logic, ids in io.ids.items():
            reason = eng.mend_reason(logic)
            if reason is None:
                continue
            assert io.backend is not None
            read_at = eng.begin_poll(logic)
            try:
                codes = await io.call("errorcode", io.backend.error_codes, ids)
            except CALL_ERRORS as e:
                event(log, logging.WARNING, "error code poll failed", logic_id=logic, error=str(e))
                eng.mark_reinit(logic)  # try again next cycle
                continue
            dropped = await io.health(ids)
            n = eng.apply_poll(logic, codes, read_at, card_dropped=bool(dropped))
            if n:
                event(
                    log,
                    logging.INFO,
                    "fault codes mended by polling",
                    logic_id=logic,
                    reason=reason,
                    events=n,
                )
