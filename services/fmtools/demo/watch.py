"""Watch clusterd's fault center (``GET /v1/faults``) and wake waiters when a fault appears or goes.

The detection time of a fault is the wall time of the first poll that showed it (polls every
``interval_s``, 0.25 s by default), so a measured latency is at most one poll period late.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from faultmesh.runtime import wait_for

Fault = dict[str, Any]
Pred = Callable[[Fault], bool]


class FaultWatcher:
    """Polls ``http://<http>/v1/faults``. ``await wait_for(pred, timeout_s)`` -> (fault, t) or None;
    ``await wait_gone(pred, timeout_s)`` -> t or None. ``errors`` counts failed polls."""

    def __init__(self, session: aiohttp.ClientSession, http: str, interval_s: float = 0.25) -> None:
        self.session = session
        self.url = f"http://{http}/v1/faults"
        self.interval_s = interval_s
        self.faults: list[Fault] = []
        self.polled_at = 0.0
        self.errors = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start polling (an owned task; :meth:`stop` cancels it)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fault-watcher")

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                async with self.session.get(self.url, timeout=aiohttp.ClientTimeout(total=3)) as r:
                    if r.status == 200:
                        data = await r.json(content_type=None)
                        async with self._changed:
                            self.faults = data if isinstance(data, list) else []
                            self.polled_at = time.time()
                            self._changed.notify_all()
                    else:
                        self.errors += 1
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                self.errors += 1
            await asyncio.sleep(self.interval_s)

    def current(self, pred: Pred) -> list[Fault]:
        """The faults of the latest poll that match ``pred``."""
        return [f for f in self.faults if _safe(pred, f)]

    async def wait_for(self, pred: Pred, timeout_s: float) -> tuple[Fault, float] | None:
        """Wait until a polled fault matches ``pred``: (the fault, wall time of that poll), or None."""
        deadline = time.monotonic() + timeout_s
        async with self._changed:
            while True:
                hits = [f for f in self.faults if _safe(pred, f)]
                if hits:
                    return hits[0], self.polled_at
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    await wait_for(self._changed.wait(), left)
                except TimeoutError:
                    return None

    async def wait_gone(self, pred: Pred, timeout_s: float) -> float | None:
        """Wait until no polled fault matches ``pred``; the wall time of that poll, or None."""
        deadline = time.monotonic() + timeout_s
        async with self._changed:
            while True:
                if self.polled_at and not any(_safe(pred, f) for f in self.faults):
                    return self.polled_at
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    await wait_for(self._changed.wait(), left)
                except TimeoutError:
                    return None


def _safe(pred: Pred, f: Fault) -> bool:
    try:
        return bool(pred(f))
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
