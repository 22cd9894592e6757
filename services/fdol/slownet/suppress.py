"""Alarm suppression by key for a configurable period.

Source: reference fdol.md §8.7: key ``srcId-dstId-faultType-level``; a repeat while the key is live
is dropped and refreshes its time; keys expire when ``now - t >= suppressed_period`` (checked at each
detection). A period of 0 suppresses nothing (the reference's default ``suppressedPeriod=0``).
"""

from __future__ import annotations


class Suppressor:
    """Keeps live alarm keys. ``period_s`` >= 0 seconds; times are seconds (any monotonic clock)."""

    def __init__(self, period_s: float) -> None:
        if period_s < 0:
            raise ValueError("suppression period must be >= 0 s")
        self.period_s = period_s
        self._live: dict[str, float] = {}
        self.suppressed = 0

    def expire(self, now_s: float) -> None:
        """Forget keys whose last sighting is ``period_s`` or more ago."""
        for k in [k for k, t in self._live.items() if now_s - t >= self.period_s]:
            del self._live[k]

    def admit(self, key: str, now_s: float) -> bool:
        """True when the alarm ``key`` should be emitted now; False (counted in ``suppressed``) when
        it is a repeat within the period. Either way the key's time is refreshed."""
        self.expire(now_s)
        live = key in self._live
        if self.period_s > 0:
            self._live[key] = now_s
        if live:
            self.suppressed += 1
            return False
        return True

    def live_keys(self) -> list[str]:
        """Keys currently suppressing repeats."""
        return sorted(self._live)
