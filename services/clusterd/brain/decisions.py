"""The brain's decision log: every recovery decision, logged (``recovery decision``), kept per job
(last :data:`MAX_DECISIONS`) and persisted in the store namespace ``decisions`` (coalesced writes).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from clusterd.store import Store
from faultmesh.log import event
from faultmesh.model import now_ms
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.brain")

MAX_DECISIONS = 200
NS = "decisions"


class DecisionLog:
    """``decisions``: job id -> deque of records (dicts: time_ms, flow, decision, reason, state,
    faults, extra). ``spawn(coro, name)`` runs the coalescing writer task."""

    def __init__(self, store: Store, registry: CollectorRegistry, spawn: Callable[..., asyncio.Task]) -> None:
        self._store = store
        self._spawn = spawn
        self.decisions: dict[str, deque] = {}
        # called with (job id, record) after each decision (the Kubernetes hand-off); must not wait
        self.listeners: list[Callable[[str, dict], None]] = []
        self._dirty: set[str] = set()  # jobs whose decisions are not written yet
        self._flusher: asyncio.Task | None = None
        self.m_decisions = Counter(
            "faultmesh_brain_decisions_total", "Recovery decisions by flow and decision", ["flow", "decision"],
            registry=registry,
        )  # fmt: skip

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
        for fn in self.listeners:
            fn(job_id, rec)
        self._dirty.add(job_id)
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._persist(), name="decisions-writer")
        return rec

    async def _persist(self) -> None:
        """Write the decisions of changed jobs (coalesced: one write per job per pass)."""
        while self._dirty:
            job_id = self._dirty.pop()
            d = self.decisions.get(job_id)
            if d is None:
                continue
            try:
                await self._store.kv_put(NS, job_id, list(d))
            except Exception as e:
                event(log, logging.ERROR, "decisions not saved", job=job_id, error=repr(e))
