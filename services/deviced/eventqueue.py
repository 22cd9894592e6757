"""deviced's queue of fault events waiting for their due time (reference deviced.md §1.1, §4.3): a
recover from a callback waits 1 s (the driver's error list lags it), an AIC/AIV bus fault waits the
HBM pairing window; :class:`deviced.engine.FaultEngine` owns one and applies what is due each cycle.

Entries are ``(due ms, arrival order, unique id, event)``, kept sorted by due time. Due events are
applied by ``(event time, arrival order, unique id)``; the synthetic events of one poll share the
arrival order of the read's :meth:`EventQueue.mark`, so a callback that arrives during the read is
newer and wins.
"""

from __future__ import annotations

import bisect

from deviced.state import OCCUR, RECOVER, Device, DeviceEvent

Order = tuple[int, float, int]  # (event time ms, arrival order, unique id)


class EventQueue:
    """See the module docstring. Not thread-safe: the engine's loop only."""

    def __init__(self) -> None:
        self._items: list[tuple[int, float, int, DeviceEvent]] = []
        self._seq = 0
        self._uid = 0

    def __len__(self) -> int:
        return len(self._items)

    def mark(self) -> float:
        """The arrival order of a read starting now: after every event queued so far, before the next."""
        return self._seq + 0.5

    def push(self, due_ms: int, ev: DeviceEvent, order: float | None = None) -> None:
        """Queue ``ev`` until ``due_ms``; ``order``: a read's :meth:`mark` (default: arrival now)."""
        self._seq += 1
        self._uid += 1
        bisect.insort(self._items, (due_ms, self._seq if order is None else order, self._uid, ev))

    def first_due(self) -> int | None:
        """The earliest due time (ms), None when empty."""
        return self._items[0][0] if self._items else None

    def take_due(self, now_ms: int) -> list[tuple[Order, DeviceEvent]]:
        """Remove the events due by ``now_ms`` and return them in application order."""
        due = 0
        while due < len(self._items) and self._items[due][0] <= now_ms:
            due += 1
        # order by event time, then by arrival (events of one callback batch share a ms stamp)
        batch = sorted(((e.time_ms, seq, uid), e) for _, seq, uid, e in self._items[:due])
        del self._items[:due]
        return batch

    def active_after(self, d: Device, logic: int, mark: tuple[int, float]) -> set[int]:
        """The non-once codes ``d`` (chip ``logic``) holds once the events queued before ``mark``
        (a read's (time ms, arrival order)) are applied in order; a stale event changes nothing."""
        expected = {c for c, st in d.codes().items() if not st.once}
        queued = sorted(((e.time_ms, seq, uid), e) for _, seq, uid, e in self._items if e.logic == logic)
        last = dict(d.last_event_ms)
        for key, ev in (x for x in queued if x[0][:2] <= mark):
            if ev.code in last and key < last[ev.code]:
                continue  # will be skipped as stale by the cycle: it does not change the cache
            last[ev.code] = key
            if ev.assertion == OCCUR:
                expected.add(ev.code)
            elif ev.assertion == RECOVER:
                expected.discard(ev.code)
        return expected
