"""The recovery registry: the jobs a Recover ``Init`` accepted (stored: TaskD's Go manager calls Init
once per process and then only Register on every reconnect, so an Init survives a clusterd
restart) and one recovery controller per registered job (clusterd.md §2.1).

One owner (the brain builds it); the Recover servicer, the job views and the fault intake read it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry
    from clusterd.store import Store

INIT_NS = "recover_init"  # store namespace: job ids a Recover Init accepted (value: true)


class RecoveryRegistry:
    """``initialised``: job ids whose Init was accepted; ``controllers``: job id -> controller.
    ``make_controller(job_id)`` builds a job's controller on Register."""

    def __init__(self, store: Store, jobs: JobRegistry, make_controller: Callable[[str], Any]) -> None:
        self._store = store
        self._jobs = jobs
        self._make = make_controller
        self.initialised: set[str] = set()
        self.controllers: dict[str, Any] = {}

    async def load(self) -> None:
        """Read the stored Inits of jobs still known; drop those of deleted jobs (best effort: else
        at the next start)."""
        inited = await self._store.kv_items(INIT_NS)
        self.initialised = {j for j in inited if self._jobs.get(j) is not None}
        for gone in set(inited) - self.initialised:
            with contextlib.suppress(Exception):
                await self._store.kv_delete(INIT_NS, gone)

    async def mark_initialised(self, job_id: str) -> None:
        """Record a successful Init: stored first, then in memory (raises the store's error when it
        refuses; nothing changed then)."""
        await self._store.kv_put(INIT_NS, job_id, True)
        self.initialised.add(job_id)

    async def register(self, job_id: str) -> Any:
        """Register: process-recover-enable=on and a new controller (returned)."""
        job = self._jobs.get(job_id)
        if job is not None and job.process_recover_enable != "on":
            await self._jobs.update(job_id, process_recover_enable="on")
        ctl = self.controllers[job_id] = self._make(job_id)
        return ctl

    def get(self, job_id: str) -> Any:
        """The job's controller, None while it is not registered."""
        return self.controllers.get(job_id)

    async def drop(self, job_id: str) -> None:
        """Close and forget a deleted job's controller (its Init is kept: Register then answers 402)."""
        ctl = self.controllers.pop(job_id, None)
        if ctl is not None:
            await ctl.close()

    async def close(self) -> None:
        """Close every controller (clusterd stops)."""
        for ctl in list(self.controllers.values()):
            await ctl.close()
