"""Fault history: every occur / update / recover of the fault center, kept in the store (issue 17).

:class:`HistoryComponent` subscribes to the fault center (its own
:class:`~faultmesh.sink.SinkWorker`, named ``history``) and for each committed change

- logs one line ``fault changed kind=<occur|update|recover> node=... device=NPU-3 code=... level=...
  source=...`` on ``clusterd.history`` (so ``grep CODE clusterd.log`` answers when it came and went);
- appends one row to the store's ``fault_events`` table (:meth:`clusterd.store.Store.append_events`).

Retention is bounded in time and rows: every ``--history-prune-s`` the rows older than
``--history-retention-s`` and all but the newest ``--history-max-rows`` are deleted. When the
subscriber falls behind and is resynced, the changes it lost are rebuilt by comparing the snapshot
with what it last knew (occur for new keys, update for changed ones, recover for gone ones), so the
history has no silent gap.

A row's time is when the change happened where the fault says so: an occur carries the fault's
first-seen time (the agent's; a fault that occurred while clusterd was down is listed at its real
time, not at the reconnect; one first seen before the retention window keeps the commit time, so
its row is not pruned at once), an update or a recover the time clusterd committed it. Rows are listed
in the order clusterd received them.

A failed write (disk full, I/O error) keeps the rows and writes them, in order, before the next
batch and every ``RETRY_S`` until the store takes them (``history write failed`` once, then
``history written after retries``); at most ``MAX_PENDING`` rows wait (the oldest beyond that are
dropped, counted in ``faultmesh_history_rows_dropped_total`` and logged).

``GET /v1/events?node=&code=&since=&limit=`` (:mod:`clusterd.http.events`) reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter

from clusterd.center import OCCUR, RECOVER, UPDATE
from clusterd.context import ClusterContext
from clusterd.http.events import EventsApi
from faultmesh.config import positive_int
from faultmesh.log import event
from faultmesh.model import Change, Fault, FaultKey, now_ms

log = logging.getLogger("clusterd.history")

CHANGED = "fault changed"
"""The stable log phrase of one fault change."""
RETRY_S = 1.0  # how often rows the store refused are tried again
MAX_PENDING = 100_000  # rows kept for a retry at most (the oldest beyond are dropped, counted)


def device_name(f: Fault) -> str:
    """``NPU-3`` for a device, ``Node`` for the node itself (device_id -1)."""
    return f.device_type if f.device_id < 0 else f"{f.device_type}-{f.device_id}"


def _when(received_ms: int, kind: str, f: Fault, retention_ms: int) -> int:
    """A history row's time (ms): an occur's first-seen time when it is known, not in the future
    and within the retention (an older one would be pruned at once: the row keeps ``received_ms``),
    else ``received_ms`` (module docstring)."""
    if kind == OCCUR and received_ms - retention_ms < f.first_seen_ms <= received_ms:
        return f.first_seen_ms
    return received_ms


@dataclass(frozen=True)
class HistoryConfig:
    """The fault history's configuration section (:func:`faultmesh.config.section`):
    ``history_retention_s`` ``--history-retention-s``, ``history_max_rows`` ``--history-max-rows``,
    ``history_prune_s`` ``--history-prune-s``."""

    history_retention_s: float
    history_max_rows: int
    history_prune_s: float


class HistoryComponent:
    """The fault history (see the module docstring). Built with the cluster context and its
    :class:`HistoryConfig`."""

    name = "history"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--history-retention-s",
            type=float,
            default=7 * 86400.0,
            help="fault history: keep changes this long (s; default 7 days)",
        )
        parser.add_argument(
            "--history-max-rows",
            type=positive_int,
            default=1_000_000,
            help="fault history: keep at most this many changes (the newest)",
        )
        parser.add_argument(
            "--history-prune-s", type=float, default=60.0, help="fault history: prune every (s)"
        )

    def __init__(self, ctx: ClusterContext, a: HistoryConfig) -> None:
        self.ctx = ctx
        self.retention_ms = int(a.history_retention_s * 1000)
        self.max_rows = a.history_max_rows
        self.prune_s = a.history_prune_s
        self._known: dict[FaultKey, Fault] = {}
        self._task: asyncio.Task | None = None
        self._retry_task: asyncio.Task | None = None
        self._pending: deque[tuple[int, str, Fault]] = deque()  # rows the store refused, oldest first
        self._failing = False
        self._write_lock = asyncio.Lock()  # one writer of _pending at a time (see _flush)
        self.dropped = Counter(
            "faultmesh_history_rows_dropped_total",
            "Fault history rows dropped because the store refused them for too long",
            registry=ctx.metrics.registry,
        )
        ctx.center.subscribe(self.name, self.publish, resync=self.resync)
        EventsApi(ctx.store).add_routes(ctx.http.app.router)

    async def start(self) -> None:
        """Remember the restored faults (a resync baseline) and start the prune loop."""
        self._known = {f.key: f for f in self.ctx.center.faults()}
        self._task = self.ctx.tasks.spawn(self._prune_loop(), name="history-prune")
        self._retry_task = self.ctx.tasks.spawn(self._retry_loop(), name="history-retry")

    async def stop(self) -> None:
        """Stop pruning; the subscriber is drained and stopped by the fault center."""
        tasks = [t for t in (self._task, self._retry_task) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        self._task = self._retry_task = None

    async def publish(self, changes: Sequence[Change]) -> None:
        """Log and store one committed batch of changes."""
        ts = now_ms()
        for c in changes:
            if c.kind == RECOVER:
                self._known.pop(c.fault.key, None)
            else:
                self._known[c.fault.key] = c.fault
        await self._record(
            [(_when(ts, c.kind, c.fault, self.retention_ms), c.kind, c.fault) for c in changes]
        )

    async def resync(self, faults: list[Fault]) -> None:
        """Rebuild the changes lost in an overflow from the snapshot ``faults``."""
        ts = now_ms()
        now = {f.key: f for f in faults}
        rows: list[tuple[int, str, Fault]] = []
        for k, f in now.items():
            old = self._known.get(k)
            if old is None:
                rows.append((_when(ts, OCCUR, f, self.retention_ms), OCCUR, f))
            elif not old.same_content(f):
                rows.append((ts, UPDATE, f))
        rows.extend((ts, RECOVER, f) for k, f in self._known.items() if k not in now)
        self._known = now
        event(log, logging.WARNING, "history resynced", changes=len(rows))
        await self._record(rows)

    async def _record(self, rows: list[tuple[int, str, Fault]]) -> None:
        for _, kind, f in rows:
            event(
                log,
                logging.INFO,
                CHANGED,
                kind=kind,
                node=f.node,
                device=device_name(f),
                code=f.code,
                level=f.level,
                source=f.source,
            )
        async with self._write_lock:
            self._pending.extend(rows)
            over = len(self._pending) - MAX_PENDING
            if over > 0:
                for _ in range(over):
                    self._pending.popleft()
                self.dropped.inc(over)
                event(
                    log,
                    logging.ERROR,
                    "history rows dropped",
                    rows=over,
                    reason="store refused them too long",
                )
            await self._flush()

    async def _flush(self) -> None:
        """Write the waiting rows in order; on failure keep them for the retry loop. Callers hold
        ``_write_lock``: the sink's batch and the retry loop must not write the same rows twice."""
        if not self._pending or not self.ctx.store.is_open:
            return
        rows = list(self._pending)
        try:
            await self.ctx.store.append_events(rows)
        except Exception as e:  # disk full, I/O error: kept, tried again
            if not self._failing:
                event(
                    log, logging.ERROR, "history write failed", error=str(e), rows=len(rows), retry_s=RETRY_S
                )
            self._failing = True
            return
        for _ in range(len(rows)):
            self._pending.popleft()
        if self._failing:
            event(log, logging.INFO, "history written after retries", rows=len(rows))
            self._failing = False

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(RETRY_S)
            if self._pending:
                async with self._write_lock:
                    await self._flush()

    async def prune(self) -> int:
        """Apply the retention once. Returns how many rows were deleted."""
        n = await self.ctx.store.prune_events(now_ms() - self.retention_ms, self.max_rows)
        if n:
            event(log, logging.INFO, "history pruned", rows=n)
        return n

    async def _prune_loop(self) -> None:
        while True:
            try:
                await self.prune()
            except Exception as e:  # a full disk must not end the loop
                event(log, logging.ERROR, "history prune failed", error=str(e))
            await asyncio.sleep(self.prune_s)
