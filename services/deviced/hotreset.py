"""Hot reset (reference deviced.md §6): an action on the engine's public API.

Each cycle, :meth:`HotReset.step` looks at the chips the engine holds at RestartNPU / FreeRestartNPU:
a chip whose job processes have stopped (process count 0) and that stayed idle ``--hot-reset-idle`` s
is reset (at most ``--hot-reset-budget`` resets per chip per ``--hot-reset-window-s``, by default 3
per 6 h), then its boot status is polled up to
``--hot-reset-boot-timeout`` s. Every state change goes through the engine: ``reset_begin`` /
``reset_end`` (re-poll after boot), ``reset_failed`` (SeparateNPU, reason HotResetFailed) and
``clear_reset_failures`` (the escalation goes with the fault). Off without ``--hot-reset`` (the
clearing still runs: a restored escalation must still go away).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from deviced.chipio import CALL_ERRORS, ChipIO
from deviced.engine import FaultEngine
from deviced.sections import HotResetConfig
from faultmesh.dcmi.api import DeviceIds
from faultmesh.dcmi.loader import DeviceNotReady
from faultmesh.dcmi.structs import BOOT_START_FINISH
from faultmesh.levels import NpuLevel
from faultmesh.log import event
from faultmesh.runtime import TaskOwner

log = logging.getLogger("deviced")

HOT_RESET_LEVELS = (NpuLevel.RestartNPU, NpuLevel.FreeRestartNPU)


async def reset_and_boot(
    io: ChipIO, ids: DeviceIds, boot_timeout_s: float, poll_s: float = 1.0, monotonic=time.monotonic
) -> str:
    """Reset one chip (the backend's ``reset``, 30 s call timeout) and poll its boot status every
    ``poll_s`` s until it reports started (16), for up to ``boot_timeout_s`` s on ``monotonic``'s clock.
    Returns '' once booted, else why not (the reset call failed, the boot did not finish in time)."""
    try:
        await io.call("reset", io.backend.reset, ids, timeout_s=30)
    except CALL_ERRORS as e:
        return f"reset call failed: {e}"
    deadline = monotonic() + boot_timeout_s
    while monotonic() < deadline:
        await asyncio.sleep(poll_s)
        try:
            if await io.call("boot", io.backend.boot_status, ids) == BOOT_START_FINISH:
                return ""
        except CALL_ERRORS:
            continue
    return f"boot not finished in {boot_timeout_s:g}s"


class HotReset:
    """The hot-reset action (see module docstring), with its section ``cfg``
    (:class:`deviced.sections.HotResetConfig`). ``tasks`` owns the running resets; ``wake()`` asks
    for a cycle; ``monotonic`` (s) is injectable. ``busy`` tells the cycle to look every second."""

    def __init__(
        self,
        cfg: HotResetConfig,
        engine: FaultEngine,
        io: ChipIO,
        tasks: TaskOwner,
        wake: Callable[[], None],
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.io = io
        self.tasks = tasks
        self.wake = wake
        self.monotonic: Callable[[], float] = time.monotonic
        self.idle_since: dict[int, float] = {}
        self.budgets: dict[int, collections.deque[float]] = collections.defaultdict(collections.deque)

    @property
    def busy(self) -> bool:
        """True while a chip waits for its idle gate or a reset runs."""
        return bool(self.idle_since) or bool(self.engine.resetting())

    async def step(self) -> None:
        """One cycle's look at the chips (after ``engine.cycle()``)."""
        for logic in self.engine.clear_reset_failures():  # the fault is gone: the escalation goes with it
            phy = self.engine.devices[logic].ids.phy
            event(log, logging.INFO, "hot reset escalation cleared", logic_id=logic, phy_id=phy)
        if not self.cfg.hot_reset:
            return
        now = self.monotonic()
        resetting = self.engine.resetting()
        for logic, d in self.engine.devices.items():
            if logic in resetting:
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
            ids = self.io.ids[logic]
            try:
                procs = await self.io.call("procs", self.io.backend.process_count, ids)
            except CALL_ERRORS:
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
                    reason=f"idle, waiting {self.cfg.hot_reset_idle:.0f}s",
                )
            since = self.idle_since.setdefault(logic, now)
            if now - since < self.cfg.hot_reset_idle:
                continue
            budget = self.budgets[logic]
            limit = self.cfg.hot_reset_budget
            window_s = self.cfg.hot_reset_window_s
            while budget and now - budget[0] > window_s:
                budget.popleft()
            if len(budget) >= limit:
                self.failed(logic, f"reset budget of {limit} per {window_s / 3600:g} h used")
                continue
            budget.append(now)
            self.engine.reset_begin(logic)
            event(
                log,
                logging.WARNING,
                "hot reset start",
                logic_id=logic,
                phy_id=ids.phy,
                fault_level=d.level.name,
                reason=f"{d.level.name} and idle {now - since:.0f}s",
            )
            self.tasks.spawn(self._reset(logic), name=f"hot-reset-{logic}")

    async def _reset(self, logic: int) -> None:
        ids, io = self.io.ids[logic], self.io
        booted = False
        try:
            try:
                health = await io.call("health", io.backend.health, ids)
            except DeviceNotReady:
                health = -8012
            if health == 0:
                event(log, logging.INFO, "hot reset skipped", logic_id=logic, reason="chip healthy again")
                return
            why = await reset_and_boot(io, ids, self.cfg.hot_reset_boot_timeout, 1.0, self.monotonic)
            if why:
                self.failed(logic, why)
                return
            booted = True
            self.idle_since.pop(logic, None)
            event(log, logging.INFO, "hot reset done", logic_id=logic, phy_id=ids.phy)
        finally:
            self.engine.reset_end(logic, booted)
            if booted:
                self.wake()

    def failed(self, logic: int, why: str) -> None:
        """A reset failed or was refused: the engine escalates the chip to SeparateNPU."""
        if self.engine.reset_failed(logic):
            event(
                log,
                logging.ERROR,
                "hot reset failed",
                logic_id=logic,
                phy_id=self.engine.devices[logic].ids.phy,
                reason=why,
                fault_level="SeparateNPU",
            )
        self.wake()
