"""The brain's decision log and decision stream: every recovery decision, logged (``recovery
decision``), kept per job (last :data:`MAX_DECISIONS`), persisted in the store namespace
``decisions`` (coalesced writes) and only then offered to the subscribers (the Kubernetes hand-off,
platform mode, ...), each through its own :class:`faultmesh.sink.SinkWorker` as the fault center's
subscribers: :meth:`DecisionLog.record` never waits and never runs a subscriber, so a slow or
failing subscriber delays no decision and loses none (issue 28). A write the store refuses is
logged (``decisions not saved``) and the decisions are still offered: the flow acted on them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from clusterd.store import Store
from faultmesh.log import event
from faultmesh.model import now_ms
from faultmesh.runtime import wait_for
from faultmesh.sink import SinkMetrics, SinkSet, SinkWorker

log = logging.getLogger("clusterd.brain")

MAX_DECISIONS = 200
NS = "decisions"
SUBSCRIBER_QUEUE = 4096  # batches a subscriber may fall behind before its backlog is dropped (counted)

Decision = tuple[str, dict]  # (job id, record)
Subscriber = Callable[[str, dict], Awaitable[None] | None]


class DecisionLog:
    """``decisions``: job id -> deque of records (dicts: time_ms, flow, decision, reason, state,
    faults, extra). ``spawn(coro, name)`` runs the coalescing writer task and the subscribers'
    tasks (:meth:`start`)."""

    def __init__(self, store: Store, registry: CollectorRegistry, spawn: Callable[..., asyncio.Task]) -> None:
        self._store = store
        self._spawn = spawn
        self.decisions: dict[str, deque] = {}
        self._sink_metrics = SinkMetrics.of(registry)
        self._sinks: SinkSet[Decision] = SinkSet(self._sink_metrics)
        self._subscribers: list[Subscriber] = []
        self._dirty: set[str] = set()  # jobs whose decisions are not written yet
        self._unoffered: list[Decision] = []  # recorded, not yet persisted and offered, in order
        self._flusher: asyncio.Task | None = None
        self.m_decisions = Counter(
            "faultmesh_brain_decisions_total", "Recovery decisions by flow and decision", ["flow", "decision"],
            registry=registry,
        )  # fmt: skip

    @property
    def listeners(self) -> list[Subscriber]:
        """The subscribed callables, in subscription order."""
        return list(self._subscribers)

    def subscribe(self, fn: Subscriber, name: str = "") -> SinkWorker[Decision]:
        """Call ``fn(job_id, record)`` (sync or async) for every decision once it is persisted, in
        decision order, in the subscriber's own task. A subscriber that raises is counted
        (``faultmesh_sink_errors_total{sink}``) and gets the next decisions; one that stalls falls
        behind alone (up to :data:`SUBSCRIBER_QUEUE` batches, then its backlog is dropped and
        counted: ``faultmesh_sink_overflows_total{sink}``). Returns the worker."""
        label = name or f"decisions-{getattr(fn, '__qualname__', 'subscriber')}"

        async def publish(batch: Sequence[Decision]) -> None:
            for job_id, rec in batch:  # one failed decision costs the subscriber only that one
                try:
                    res = fn(job_id, rec)
                    if asyncio.iscoroutine(res):
                        await res
                except Exception as e:
                    self._sink_metrics.errors.labels(label).inc()
                    event(log, logging.ERROR, "sink failed", sink=label, job=job_id, error=repr(e))

        self._subscribers.append(fn)
        return self._sinks.add(label, publish, maxsize=SUBSCRIBER_QUEUE)

    def start(self) -> None:
        """Start the subscribers' tasks (ClusterD's start; later subscribers start at once)."""
        self._sinks.start(self._spawn)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is left, let the subscribers catch up, stop them (within ``timeout_s`` s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            await self.flush(timeout_s)
        except TimeoutError:
            event(log, logging.WARNING, "decisions not flushed", timeout_s=timeout_s)
        await self._sinks.drain(max(0.0, deadline - loop.time()))
        await self._sinks.stop()

    async def load(self) -> None:
        """Read the persisted decisions (after a restart)."""
        for key, items in (await self._store.kv_items(NS)).items():
            if isinstance(items, list):
                self.decisions[key] = deque(items[-MAX_DECISIONS:], maxlen=MAX_DECISIONS)

    async def flush(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` for the writer (the last decisions are kept on shutdown)."""
        if self._flusher is not None and not self._flusher.done():
            await wait_for(asyncio.shield(self._flusher), timeout_s)

    def record(
        self, job_id: str, flow: str, decision: str, reason: str, state: str, faults=None, **extra: Any
    ) -> dict:
        """Record one decision: logged, kept and persisted. Returns the record."""
        rec = {"time_ms": now_ms(), "flow": flow, "decision": decision, "reason": reason, "state": state}
        if faults:
            rec["faults"] = [f.as_dict() for f in faults]
        rec.update({k: v for k, v in extra.items() if v not in (None, "", [])})
        d = self.decisions.setdefault(job_id, deque(maxlen=MAX_DECISIONS))
        d.append(rec)
        self.m_decisions.labels(flow, decision).inc()
        event(
            log,
            logging.INFO,
            "recovery decision",
            job=job_id,
            flow=flow,
            decision=decision,
            reason=reason,
            ranks=",".join(sorted({str(f.rank) for f in faults or ()}, key=int)),
        )
        self._unoffered.append((job_id, rec))
        self._dirty.add(job_id)
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._persist(), name="decisions-writer")
        return rec

    async def _persist(self) -> None:
        """Write the decisions of changed jobs (coalesced: one write per job per pass), then offer
        the decisions that pass wrote to the subscribers, in decision order."""
        while self._dirty or self._unoffered:
            batch, self._unoffered = self._unoffered, []
            dirty, self._dirty = self._dirty, set()
            for job_id in dirty:
                d = self.decisions.get(job_id)
                if d is None:
                    continue
                try:
                    await self._store.kv_put(NS, job_id, list(d))
                except Exception as e:
                    event(log, logging.ERROR, "decisions not saved", job=job_id, error=repr(e))
            if batch:
                self._sinks.offer(batch)
