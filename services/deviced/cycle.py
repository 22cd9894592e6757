"""deviced's cycle (reference deviced.md §1.2): sources' cycle hooks -> engine -> actions -> sinks.

The cycle runs within ~1 s of a wake-up (a callback batch, a probe change, a job update) and at
least every ``--list-watch-period`` s (3..1800), sooner when a queued event (e.g. a delayed
recover) falls due, and every second while an action is busy (a hot reset waits or runs, a
graceful-tolerance episode runs); callback-triggered cycles are at most one per second. One cycle:
each source's ``on_cycle`` in ``SOURCES`` order (card drop, mend polling, link check, switch
events), ``engine.cycle()``, the actions' steps (:class:`Actions`: hot reset, graceful tolerance),
then the sinks.

The fast fault path (issue 18, ``--fast-fault-path``, on by default): a DCMI callback batch does not
wait for that one-per-second gap. It runs a *fast cycle* after ``FAST_COALESCE_S`` (so a burst is one
cycle): ``engine.cycle()`` and the sinks only, no source hooks (they call DCMI) and no action step,
which stay on the full cycle that still follows within the second. The engine's rules are stamped
with the events' own times, so frequency / duration / recover-delay timing is unchanged; only the
report leaves sooner (the reference reports within ~1 s, deviced.md §1.2).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from prometheus_client import Histogram

from deviced.engine import FaultEngine
from faultmesh.log import event
from faultmesh.runtime import wait_for

log = logging.getLogger("deviced")

FAST_COALESCE_S = 0.01  # a callback burst within 10 ms becomes one fast cycle


class Action(Protocol):
    """An action run after ``engine.cycle()``: the hot reset (:mod:`deviced.hotreset`), the graceful
    tolerance (:mod:`deviced.grace`). ``busy``: the cycle must run every second."""

    @property
    def busy(self) -> bool: ...

    async def step(self) -> None: ...


class Actions:
    """Several actions as one, stepped in order; busy when any is."""

    def __init__(self, *actions: Action) -> None:
        self.actions = actions

    @property
    def busy(self) -> bool:
        return any(a.busy for a in self.actions)

    async def step(self) -> None:
        for a in self.actions:
            await a.step()


class Cycle:
    """Runs cycles (see module docstring). ``hooks`` are the sources' ``on_cycle`` coroutines;
    ``publish()`` runs the sinks. ``cycles`` counts finished cycles; ``wake()`` asks for one soon."""

    def __init__(
        self,
        engine: FaultEngine,
        hooks: Sequence[Callable[[], Awaitable[None]]],
        hot_reset: Action,
        publish: Callable[[], None],
        poll_seconds: Histogram,
        period_s: float,
        fast_path: bool = True,
    ) -> None:
        self.engine = engine
        self.hooks = list(hooks)
        self.hot_reset = hot_reset
        self.publish = publish
        self.poll_seconds = poll_seconds
        self.period_s = period_s
        self.fast_path = fast_path
        self.trigger = asyncio.Event()
        self.urgent = asyncio.Event()
        self.cycles = 0
        self.fast_cycles = 0
        self._last = 0.0

    def wake(self) -> None:
        """Ask for a cycle soon (loop thread only)."""
        self.trigger.set()

    def wake_urgent(self) -> None:
        """Ask for a cycle soon and, with the fast path on, report the engine's new state at once
        (a fast cycle, see the module docstring). Loop thread only."""
        if self.fast_path:
            self.urgent.set()
        self.trigger.set()

    def fast_cycle(self) -> None:
        """Engine and sinks only (see the module docstring)."""
        self.engine.cycle()
        self.fast_cycles += 1
        self.publish()

    async def run_cycle(self) -> None:
        """One cycle (see module docstring)."""
        self._last = time.monotonic()
        t0 = time.perf_counter()
        for hook in self.hooks:
            await hook()
        self.poll_seconds.observe(time.perf_counter() - t0)
        self.engine.cycle()
        self.cycles += 1
        await self.hot_reset.step()
        self.publish()

    def next_wait(self) -> float:
        """Seconds until the next cycle is due without a wake-up."""
        wait = self.period_s
        nxt = self.engine.next_due_ms()
        if nxt is not None:
            wait = min(wait, max(0.05, (nxt - self.engine.now()) / 1000))
        if self.hot_reset.busy:  # hot-reset candidates (idle gate), a graceful-tolerance flow: each second
            wait = min(wait, 1.0)
        return wait

    async def run(self) -> None:
        """Cycle forever (until cancelled); a failed cycle is logged and the loop goes on."""
        while True:
            try:
                await wait_for(self.trigger.wait(), self.next_wait())
            except TimeoutError:
                pass
            gap = 1.0 - (time.monotonic() - self._last)
            if self.trigger.is_set() and gap > 0 and self.cycles > 0:
                await self._gap(min(gap, 1.0))  # at most one callback-triggered cycle per second
            self.trigger.clear()
            self.urgent.clear()
            try:
                await self.run_cycle()
            except Exception as e:  # one bad cycle must not end the loop
                event(log, logging.ERROR, "cycle failed", error=repr(e))

    async def _gap(self, gap_s: float) -> None:
        """Wait ``gap_s`` s before the next full cycle, running a fast cycle for each urgent wake-up."""
        end = time.monotonic() + gap_s
        while (left := end - time.monotonic()) > 0:
            try:
                await wait_for(self.urgent.wait(), left)
            except TimeoutError:
                return
            await asyncio.sleep(FAST_COALESCE_S)
            self.urgent.clear()
            try:
                self.fast_cycle()
            except Exception as e:  # the full cycle after the gap tries again
                event(log, logging.ERROR, "cycle failed", error=repr(e), fast=True)
