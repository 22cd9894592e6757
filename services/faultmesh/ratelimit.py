"""Token buckets, as the reference's limiters use them (clusterd.md §1, §5)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` stored; ``take()`` never waits.

    ``clock`` returns seconds (monotonic); inject one in tests.
    """

    __slots__ = ("rate", "burst", "_tokens", "_last", "_clock")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._clock = clock
        self._last = clock()

    def take(self, n: float = 1.0) -> bool:
        """Take ``n`` tokens if available. Returns False (and takes nothing) when the bucket is short."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False
