"""Sinks: consumers of changes, each with its own bounded queue and task (issue 12, anchors §7).

A producer (clusterd's fault center writer, an agent's state) hands every committed batch to
:meth:`SinkWorker.offer`, which never waits and never runs the consumer: the consumer runs in the
worker's own task. So a slow consumer delays only itself. When its queue is full (``maxsize``
batches) the worker drops what is queued, counts an overflow and, once it catches up, calls the
consumer's ``resync(snapshot)`` with a fresh snapshot from ``snapshot()`` instead of the lost
batches: it converges to the truth rather than replaying history it fell behind on.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter

from faultmesh.log import event

C = TypeVar("C")
log = logging.getLogger("faultmesh.sink")

__all__ = ["FaultSink", "SinkMetrics", "SinkSet", "SinkWorker"]


_RESYNC: Any = object()  # queued in place of a dropped backlog


class FaultSink(Protocol[C]):
    """A consumer of change batches. ``publish`` gets batches in commit order; ``resync`` gets the
    whole current state after the sink fell behind (or at start)."""

    name: str

    async def publish(self, changes: Sequence[C]) -> None: ...
    async def resync(self, snapshot: Any) -> None: ...


class SinkMetrics:
    """``faultmesh_sink_overflows_total{sink}`` and ``faultmesh_sink_errors_total{sink}``. One per
    registry: use :meth:`of` (the counters can be registered only once)."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, SinkMetrics] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, registry: CollectorRegistry) -> SinkMetrics:
        """The sink counters of ``registry`` (made on first use, shared by every producer after)."""
        m = cls._by_registry.get(registry)
        if m is None:
            m = cls._by_registry[registry] = cls(registry)
        return m

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.overflows = Counter(
            "faultmesh_sink_overflows",
            "sink queue overflows (resynced from a snapshot)",
            ["sink"],
            registry=registry,
        )
        self.errors = Counter("faultmesh_sink_errors", "sink calls that raised", ["sink"], registry=registry)


class SinkWorker(Generic[C]):
    """One bounded queue and one task for one consumer.

    ``name`` (log/metrics label), ``publish(batch)`` (sync or async callable), ``resync(snapshot)``
    and ``snapshot()`` (optional: without them an overflow is only counted and logged),
    ``maxsize`` (batches, default 1024). Start with :meth:`run` as an owned task.
    """

    def __init__(
        self,
        name: str,
        publish: Callable[[Sequence[C]], Awaitable[None] | None],
        *,
        resync: Callable[[Any], Awaitable[None] | None] | None = None,
        snapshot: Callable[[], Any] | None = None,
        maxsize: int = 1024,
        metrics: SinkMetrics | None = None,
    ) -> None:
        self.name = name
        self._publish = publish
        self._resync = resync
        self._snapshot = snapshot
        self._queue: asyncio.Queue[Sequence[C]] = asyncio.Queue(maxsize=maxsize)
        self._need_resync = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._metrics = metrics
        self.delivered = 0
        self.overflows = 0

    def offer(self, batch: Sequence[C]) -> None:
        """Queue one batch (never waits). On a full queue: drop the backlog and queue one resync
        instead; batches offered until that resync runs are covered by its snapshot and dropped."""
        if self._need_resync:
            return
        self._idle.clear()
        try:
            self._queue.put_nowait(batch)
        except asyncio.QueueFull:
            self.overflows += 1
            if self._metrics is not None:
                self._metrics.overflows.labels(self.name).inc()
            event(log, logging.WARNING, "sink overflow", sink=self.name, queued=self._queue.qsize())
            while not self._queue.empty():
                self._queue.get_nowait()
            self._need_resync = True
            self._queue.put_nowait(_RESYNC)

    def pending(self) -> int:
        """Batches waiting."""
        return self._queue.qsize()

    async def _call(self, fn: Callable[[Any], Awaitable[None] | None], arg: Any) -> None:
        try:
            res = fn(arg)
            if asyncio.iscoroutine(res):
                await res
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken consumer must not stop its worker
            if self._metrics is not None:
                self._metrics.errors.labels(self.name).inc()
            event(log, logging.ERROR, "sink failed", sink=self.name, error=repr(e))

    async def run(self) -> None:
        """Deliver batches (and resyncs) in order until cancelled."""
        while True:
            if self._queue.empty():
                self._idle.set()
            item = await self._queue.get()
            if item is _RESYNC:
                self._need_resync = False
                if self._resync is not None and self._snapshot is not None:
                    await self._call(self._resync, self._snapshot())
                continue
            await self._call(self._publish, item)
            self.delivered += 1

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` s until the queue is empty. True when drained."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


class SinkSet(Generic[C]):
    """The subscribers of one producer (the fault center's changes, the brain's decisions): one
    :class:`SinkWorker` per subscriber, all fed by :meth:`offer`, which never waits.

    ``metrics``: shared :class:`SinkMetrics`; ``snapshot()``: what a subscriber's ``resync`` gets
    after an overflow (None: an overflow is only counted). Subscribers added before :meth:`start`
    begin with it, later ones at once.
    """

    def __init__(self, metrics: SinkMetrics, snapshot: Callable[[], Any] | None = None) -> None:
        self._metrics = metrics
        self._snapshot = snapshot
        self.workers: list[SinkWorker[C]] = []
        self._tasks: list[asyncio.Task] = []
        self._spawn: Callable[..., asyncio.Task] | None = None

    def add(
        self,
        name: str,
        publish: Callable[[Sequence[C]], Awaitable[None] | None],
        *,
        resync: Callable[[Any], Awaitable[None] | None] | None = None,
        maxsize: int = 1024,
    ) -> SinkWorker[C]:
        """Add one subscriber; returns its worker."""
        snapshot = self._snapshot if resync is not None else None
        w: SinkWorker[C] = SinkWorker(
            name, publish, resync=resync, snapshot=snapshot, maxsize=maxsize, metrics=self._metrics
        )
        self.workers.append(w)
        if self._spawn is not None:
            self._tasks.append(self._spawn(w.run(), name=f"sink-{name}"))
        return w

    def start(self, spawn: Callable[..., asyncio.Task]) -> None:
        """Start every subscriber's task with ``spawn(coro, name=...)`` (the daemon's TaskOwner)."""
        self._spawn = spawn
        for w in self.workers:
            self._tasks.append(spawn(w.run(), name=f"sink-{w.name}"))

    def offer(self, batch: Sequence[C]) -> None:
        """Hand ``batch`` to every subscriber (never waits, never runs a subscriber)."""
        for w in self.workers:
            w.offer(batch)

    async def drain(self, budget_s: float) -> bool:
        """Wait up to ``budget_s`` s in all until every subscriber caught up. True when all did;
        each one still behind is logged (``sink not drained``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        ok = True
        for w in self.workers:
            if not await w.drain(max(0.0, deadline - loop.time())):
                event(log, logging.WARNING, "sink not drained", sink=w.name, pending=w.pending())
                ok = False
        return ok

    async def stop(self) -> None:
        """Cancel the subscribers' tasks (after :meth:`drain`); waits at most 1 s for them."""
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)
        self._tasks.clear()
