"""One retry/backoff policy for every reconnect loop and retried call (issue 12).

The delay policy is tenacity's ``wait_exponential_jitter`` (a well-kept library rather than one more
hand-written doubling loop): ``initial_s`` doubled per failure, capped at ``max_s``, plus up to
``jitter_s`` of random jitter so that a fleet of agents does not reconnect in lockstep.

- :class:`Backoff` is the state of one loop: ``next_delay()`` after a failure, ``reset()`` after a
  success (or call :meth:`Backoff.success_after` with how long the last attempt lasted).
- :func:`retrying` retries one awaitable call on the given exception types.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity

T = TypeVar("T")

__all__ = ["Backoff", "retrying"]


class _Attempt:
    """The one field of tenacity's RetryCallState that its wait strategies read."""

    __slots__ = ("attempt_number",)

    def __init__(self, n: int) -> None:
        self.attempt_number = n


class Backoff:
    """Exponential backoff with jitter for a long-running loop.

    ``initial_s`` first delay (s), ``max_s`` cap (s), ``jitter_s`` random extra (s, default 10 % of
    ``initial_s``), ``healthy_s``: an attempt that lasted at least this long (s) resets the backoff.
    """

    def __init__(
        self,
        initial_s: float = 0.5,
        max_s: float = 10.0,
        jitter_s: float | None = None,
        healthy_s: float = 30.0,
    ) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s (got {initial_s}, {max_s})")
        self.initial_s = initial_s
        self.max_s = max_s
        self.healthy_s = healthy_s
        jitter = initial_s * 0.1 if jitter_s is None else jitter_s
        self._wait = tenacity.wait_exponential_jitter(multiplier=initial_s, max=max_s, jitter=jitter)
        self.failures = 0

    def next_delay(self) -> float:
        """Count one failure and return how long to wait before the next attempt (s, <= max_s)."""
        self.failures += 1
        return min(self.max_s, float(self._wait(_Attempt(self.failures))))

    def reset(self) -> None:
        """A success: the next failure waits ``initial_s`` again."""
        self.failures = 0

    def success_after(self, lasted_s: float) -> None:
        """Reset when the last attempt lasted ``lasted_s`` >= ``healthy_s`` (a session that stayed up)."""
        if lasted_s >= self.healthy_s:
            self.reset()


async def retrying(
    fn: Callable[[], Awaitable[T]],
    *,
    on: tuple[type[BaseException], ...],
    attempts: int = 5,
    initial_s: float = 0.2,
    max_s: float = 5.0,
) -> T:
    """Await ``fn()`` until it returns, retrying up to ``attempts`` times on exceptions of types
    ``on`` with exponential backoff (``initial_s`` .. ``max_s`` s). Re-raises the last error."""
    async for attempt in tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(on),
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential_jitter(
            multiplier=initial_s, max=max_s, jitter=initial_s * random.random()
        ),
        reraise=True,
    ):
        with attempt:
            return await fn()
    raise AssertionError("unreachable")  # pragma: no cover
