"""Switch (lingqu) faults (reference deviced.md §7): the subscription plus a full query at start and
every ``--switch-query-interval`` s (300) — every ``--list-watch-period`` s when the subscription
failed. Events from the lingqu thread are queued (bounded: ``SWITCH_QUEUE_MAX``; beyond, the next
cycle replaces them with a full query) and applied to the :class:`deviced.switch.SwitchState` in the
cycle."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from deviced.chipio import CALL_ERRORS
from deviced.sources.base import Deps
from deviced.sources.chip import subscribe_tries
from faultmesh.dcmi.lingqu import SwitchEvent
from faultmesh.log import event
from faultmesh.model import Fault
from faultmesh.source import PolledSource, Support

log = logging.getLogger("deviced")

SWITCH_QUEUE_MAX = 10_000  # queued switch events; beyond, a full query replaces them


class LingquSwitch(PolledSource):
    """The lingqu switch source (see module docstring). ``queue`` holds events not yet applied,
    ``resync_pending`` is set after an overflow, ``switch_drops`` counts dropped events and
    ``subscribed`` says whether the subscription is up."""

    name = "lingqu"
    fault_sources = ()  # the engine's sink reports (and readies) dcmi / lingqu

    def __init__(self, deps: Deps) -> None:
        super().__init__()
        self.deps = deps
        self.interval_s = float(deps.args.switch_query_interval)
        self.jitter = 0.0
        self.subscribed = False
        self.queue: list[SwitchEvent] = []
        self.resync_pending = False
        self.switch_drops = 0
        self._lock = threading.Lock()

    def supported(self) -> Support:
        """Needs a backend with a switch library, and no ``--no-switch``."""
        if self.deps.args.no_switch:
            return Support(False, "--no-switch")
        if getattr(self.deps.io.backend, "switch", None) is None:
            return Support(False, "no lingqu library")
        return Support(True)

    async def run(self) -> None:
        """``init``, subscribe (3 tries), then the full-query loop."""
        io = self.deps.io
        sw = io.backend.switch
        try:
            await io.call("lq_init", sw.init)
        except CALL_ERRORS as e:
            event(log, logging.ERROR, "switch init failed", error=str(e))
            return

        async def once() -> None:
            await io.call("lq_subscribe", sw.subscribe, self.on_event)

        self.subscribed = await subscribe_tries(once, 1.0, "switch subscription failed") is not None
        if not self.subscribed:
            self.interval_s = float(self.deps.args.list_watch_period)
        await super().run()

    async def poll(self) -> Iterable[Fault]:
        """One full query into the switch state (a change asks for a cycle)."""
        sw = self.deps.io.backend.switch
        try:
            events = await self.deps.io.call("lq_fault_info", sw.fault_info)
        except CALL_ERRORS as e:
            event(log, logging.WARNING, "switch query failed", error=str(e))
            raise
        if self.deps.switch.replace(events):
            self.deps.wake()
        event(log, logging.INFO, "switch of 910A3 get fault codes", count=len(events))
        return ()

    def publish(self, faults: Iterable[Fault]) -> None:
        """Nothing to publish: the switch state is reported by the cycle."""

    def on_event(self, ev: SwitchEvent) -> None:
        """Runs on the lingqu thread: queue the event (bounded) and ask for a cycle."""
        with self._lock:
            if len(self.queue) >= SWITCH_QUEUE_MAX:
                self.switch_drops += 1  # bounded: the next cycle re-reads the full list instead
                self.resync_pending = True
                return
            self.queue.append(ev)
        if self.ctx is not None:
            self.ctx.from_thread(self.deps.wake)

    async def on_cycle(self) -> None:
        """Apply the queued events; after an overflow, replace them with a full query."""
        with self._lock:
            batch, self.queue = self.queue, []
            resync, self.resync_pending = self.resync_pending, False
        for ev in batch:
            self.deps.switch.apply(ev)
        sw = getattr(self.deps.io.backend, "switch", None)
        if resync and sw is not None:
            try:
                self.deps.switch.replace(await self.deps.io.call("lq_fault_info", sw.fault_info))
            except CALL_ERRORS:
                self.resync_pending = True
