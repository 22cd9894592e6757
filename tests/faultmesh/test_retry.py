"""faultmesh.retry: the one backoff policy."""

from __future__ import annotations

import pytest

from faultmesh.retry import Backoff, retrying


def test_backoff_doubles_to_the_cap_and_resets():
    b = Backoff(initial_s=0.5, max_s=4.0, jitter_s=0.0)
    assert [b.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    b.reset()
    assert b.next_delay() == 0.5


def test_backoff_jitter_stays_bounded():
    b = Backoff(initial_s=1.0, max_s=8.0, jitter_s=0.5)
    delays = [b.next_delay() for _ in range(10)]
    assert 1.0 <= delays[0] <= 1.5
    assert all(d <= 8.0 for d in delays)


def test_backoff_resets_only_after_a_healthy_session():
    b = Backoff(initial_s=1.0, max_s=10.0, jitter_s=0.0, healthy_s=30.0)
    b.next_delay()
    b.next_delay()
    b.success_after(5.0)
    assert b.next_delay() == 4.0
    b.success_after(31.0)
    assert b.next_delay() == 1.0


def test_backoff_rejects_bad_bounds():
    with pytest.raises(ValueError):
        Backoff(initial_s=0)
    with pytest.raises(ValueError):
        Backoff(initial_s=5, max_s=1)


async def test_retrying_retries_the_named_errors_only():
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "ok"

    assert await retrying(flaky, on=(ConnectionError,), initial_s=0.001, max_s=0.01) == "ok"
    assert len(calls) == 3

    async def broken():
        raise ValueError("bug")

    with pytest.raises(ValueError):
        await retrying(broken, on=(ConnectionError,), initial_s=0.001)

    async def always_down():
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await retrying(always_down, on=(ConnectionError,), attempts=2, initial_s=0.001)
