"""The fault center's write queue, fair across writers (issue 18: a storming agent delays itself).

Every operation is queued on a *lane*: one agent stream's (node, agent), or the shared lane of the
components (PubFault, FD-OL, expiry, ...). Within a lane operations leave in the order they came;
across lanes a batch takes them round-robin, one operation of each waiting lane in turn, so an
operation waits behind at most one operation of every other lane per operation queued before it on
its own lane, never behind another lane's whole backlog: a burst of 64 Deltas on one stream costs
another stream's next Delta at most one position. A batch ends at ``max_items`` operations or once
it holds ``max_cost`` rows (upserts + removals; an operation is never split), so one batch's commit,
and with it the wait of whatever comes next, stays bounded however much is queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

SHARED: Hashable = ""  # the lane of every writer that names none


class FairQueue(Generic[T]):
    """Items on lanes, taken in batches round-robin across lanes (module docstring). Never bounded
    here: each writer bounds what it has in flight (an agent stream: ``MAX_IN_FLIGHT``)."""

    def __init__(self) -> None:
        self._lanes: dict[Hashable, deque[tuple[T, int]]] = {}
        self._turn: deque[Hashable] = deque()  # the lanes with items, in their round-robin order
        self._ready = asyncio.Event()
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def put(self, item: T, lane: Hashable = SHARED, cost: int = 1) -> None:
        """Queue ``item`` at the end of ``lane``; ``cost``: the rows it writes (a batch's budget)."""
        q = self._lanes.get(lane)
        if q is None:
            q = self._lanes[lane] = deque()
            self._turn.append(lane)
        q.append((item, cost))
        self._n += 1
        self._ready.set()

    def take(self, max_items: int, max_cost: int) -> list[T]:
        """The next batch without waiting (empty when nothing is queued): round-robin over the
        waiting lanes, one item each per turn, until ``max_items`` items or ``max_cost`` rows (at
        least one item)."""
        out: list[T] = []
        cost = 0
        lanes, turn = self._lanes, self._turn
        while turn and len(out) < max_items:
            lane = turn[0]
            q = lanes[lane]
            item, c = q[0]
            if out and cost + c > max_cost:
                break
            q.popleft()
            out.append(item)
            cost += c
            turn.popleft()
            if q:
                turn.append(lane)
            else:
                del lanes[lane]
        self._n -= len(out)
        if not self._n:
            self._ready.clear()
        return out

    async def get(self, max_items: int, max_cost: int) -> list[T]:
        """Wait until something is queued, then :meth:`take` a batch (never empty)."""
        while not self._n:
            await self._ready.wait()
        return self.take(max_items, max_cost)
