"""Device timing for :class:`faultmesh.profiler.Profiler` on GPU jobs (issue 33): CUDA events.

On a GPU, a step's or a collective's host range is only the time to *launch* its kernels; the device
runs them later, asynchronously. :class:`EventTimer` records a timing event at the start and the end of
each device range (``torch.cuda.Event(enable_timing=True)``, on the current stream) and turns them into
device timestamps when the events have completed, so the DEVICE_START / DEVICE_END records carry the
device's own times and FD-OL's durations (step, forward, collectives) are the device's. Nothing blocks
the training loop: completed events are collected at step boundaries (``event.query()``), the rest
stay pending; :meth:`EventTimer.drain` with ``wait=True`` (at ``Profiler.close``) synchronizes.

Clock: device times are ``anchor_host_ns + anchor.elapsed_time(event)`` (ms -> ns): one anchor event
recorded and synchronized at creation, whose host time is read right after. ``elapsed_time`` is the
GPU's own clock (about 0.5 µs resolution), so durations are exact to that; the absolute offset carries
the anchor's host-read error (µs) and the drift between the GPU and host clocks (ppm: below 1 ms per
hour), which FD-OL's per-rank durations do not see.

The CPU path is unchanged: a Profiler without a timer writes host times as device times, as before.
Bounded: at most ``max_pending`` ranges wait for their events; beyond that a range is written with its
host times and counted in ``fallbacks``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

MAX_PENDING = 20_000

# (range id, name, domain, host t0 ns, host t1 ns, start event, end event)
Pending = tuple[int, str, str, int, int, Any, Any]
# (range id, name, domain, host t0, host t1, device t0, device t1), all ns
Timed = tuple[int, str, str, int, int, int, int]


class EventTimer:
    """Timing events of device ranges. ``new_event()`` returns an object with ``record()``,
    ``query() -> bool``, ``synchronize()`` and ``elapsed_time(other) -> ms`` (the shape of
    ``torch.cuda.Event(enable_timing=True)``); ``host_ns`` reads the host clock (``time.time_ns``)."""

    def __init__(
        self,
        new_event: Callable[[], Any],
        host_ns: Callable[[], int] = time.time_ns,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.new_event = new_event
        self.max_pending = max_pending
        self.fallbacks = 0
        self._lock = threading.Lock()
        self._pending: list[Pending] = []
        self.anchor = new_event()
        self.anchor.record()
        self.anchor.synchronize()
        self.anchor_host_ns = host_ns()

    @classmethod
    def cuda(cls) -> EventTimer | None:
        """A timer over ``torch.cuda.Event`` when torch sees a CUDA device, else None (CPU job)."""
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        return cls(lambda: torch.cuda.Event(enable_timing=True))

    def record(self) -> Any:
        """A new event recorded now on the current stream."""
        ev = self.new_event()
        ev.record()
        return ev

    def device_ns(self, ev: Any) -> int:
        """The device time of a completed event (ns, on the host clock's scale)."""
        return self.anchor_host_ns + round(self.anchor.elapsed_time(ev) * 1e6)

    def add(self, item: Pending) -> bool:
        """Queue one finished range; False (counted in ``fallbacks``) when ``max_pending`` are waiting."""
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self.fallbacks += 1
                return False
            self._pending.append(item)
            return True

    def drain(self, wait: bool = False) -> list[Timed]:
        """The ranges whose end event has completed, in order, with device times (``wait``: all of
        them, synchronizing each end event first)."""
        with self._lock:
            pending, self._pending = self._pending, []
        done: list[Timed] = []
        keep: list[Pending] = []
        for item in pending:
            rid, name, domain, t0, t1, ev0, ev1 = item
            if keep or not (wait or ev1.query()):  # a stream completes in order: keep the rest
                keep.append(item)
                continue
            if wait:
                ev1.synchronize()
            done.append((rid, name, domain, t0, t1, self.device_ns(ev0), self.device_ns(ev1)))
        if keep:
            with self._lock:
                self._pending[:0] = keep
        return done

    def pending(self) -> int:
        """Ranges still waiting for their events."""
        with self._lock:
            return len(self._pending)
