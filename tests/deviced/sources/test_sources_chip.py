"""The chip-events source's callback limiter (reference deviced.md §1.1: ``--callback-rate-limit``
accepted callbacks per minute, a burst of as many), on faultmesh.ratelimit.TokenBucket."""

from __future__ import annotations

from deviced.sources.chip import callback_bucket


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_000_000.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket():
    clock = Clock()
    b = callback_bucket(1000, clock=clock)
    assert sum(b.take() for _ in range(1500)) == 1000
    clock.t += 6  # 100 tokens back
    assert sum(b.take() for _ in range(500)) == 100
