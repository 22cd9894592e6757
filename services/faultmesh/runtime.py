"""Process runtime shared by the daemons: event loop choice, owned tasks, blocking executor, signals.

- :func:`run` starts a coroutine (on uvloop when importable and asked for) and turns SIGTERM/SIGINT
  into a stop event.
- :class:`TaskOwner` owns background tasks and cancels and awaits them on close (with a timeout).
- :class:`BlockingPool` runs blocking calls (pyghmi, ctypes DCMI) in a bounded thread pool, each with
  a timeout; the event loop never blocks. Source: brief "Async code", architecture-anchors.md §7.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from faultmesh.log import event

T = TypeVar("T")
log = logging.getLogger("faultmesh.runtime")


async def wait_for(aw: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``aw`` for at most ``timeout_s`` seconds (None: no limit); raises ``TimeoutError``.

    Use this, never ``asyncio.wait_for``: on Python 3.11 ``asyncio.wait_for`` swallows the caller's
    cancellation when the awaited thing finishes at the same moment (CPython gh-86296; 3.12 rebuilt
    it on ``asyncio.timeout``), so a loop like ``while True: await wait_for(event.wait(), t)`` goes
    on running after its owner cancelled it (deviced's cycle outlived ``stop()`` that way).
    """
    async with asyncio.timeout(timeout_s):
        return await aw


class BlockingTimeout(TimeoutError):
    """A blocking call did not finish within its timeout (the thread is left to finish on its own)."""


class BlockingPool:
    """A bounded thread pool for blocking calls. ``max_workers`` threads; ``call`` has a timeout (s)."""

    def __init__(self, max_workers: int = 2, name: str = "blocking") -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        self._sem = asyncio.Semaphore(max_workers * 4)

    async def call(self, timeout_s: float, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the pool. Raises :class:`BlockingTimeout` after ``timeout_s`` seconds."""
        loop = asyncio.get_running_loop()
        async with self._sem:
            fut = loop.run_in_executor(self._pool, fn, *args)
            try:
                return await wait_for(asyncio.shield(fut), timeout_s)
            except TimeoutError:
                fut.add_done_callback(_swallow)
                raise BlockingTimeout(f"{getattr(fn, '__name__', fn)} timed out after {timeout_s}s") from None

    def shutdown(self) -> None:
        """Stop accepting work; running calls finish in their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _swallow(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


class TaskOwner:
    """Owns background tasks: ``spawn`` keeps a reference, ``close`` cancels and awaits them all."""

    def __init__(self, name: str = "tasks") -> None:
        self._name = name
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task:
        """Start ``coro`` as an owned task; a crash is logged (``task crashed``), never silent."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            event(log, logging.ERROR, "task crashed", owner=self._name, task=task.get_name(), error=repr(exc))

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Cancel every owned task and wait up to ``timeout_s`` seconds for them to end. A task
        spawned while the close runs (a cancelled task's cleanup) is cancelled too."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending: set[asyncio.Task] = set()
        while tasks := set(self._tasks) - pending:
            for t in tasks:
                t.cancel()
            left = deadline - loop.time()
            if left <= 0:
                pending |= tasks
                break
            _done, late = await asyncio.wait(tasks, timeout=left)
            pending |= late
        if pending:
            event(log, logging.WARNING, "tasks did not stop", owner=self._name, pending=len(pending))


def install_uvloop() -> bool:
    """Make uvloop the loop for :func:`asyncio.run` when importable. Returns True when installed."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run(main: Callable[[asyncio.Event], Awaitable[int | None]], fast_loop: bool = True) -> int:
    """Run ``main(stop_event)`` on uvloop (when available and ``fast_loop``; else on asyncio's own
    loop); SIGTERM/SIGINT set ``stop_event`` and log "stop requested" (signal=...) once.

    The agents pass ``fast_loop=False``: a loop that wakes a few times a minute gains nothing from
    uvloop, which costs an idle agent 2.6 MiB resident (issue 18); ClusterD keeps it.

    Returns main's exit status (0 when it returns None).
    """
    if fast_loop:
        install_uvloop()

    async def _runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if not stop.is_set():  # one line per stop, however many signals follow
                event(log, logging.INFO, "stop requested", signal=sig.name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal, sig)
        rc = await main(stop)
        return int(rc or 0)

    return asyncio.run(_runner())


class StopBudget:
    """What is left of a daemon's shutdown budget: ``take(stage_s)`` -> min(stage_s, left) s (0 once
    spent)."""

    def __init__(self, total_s: float) -> None:
        self._deadline = asyncio.get_running_loop().time() + total_s

    def take(self, stage_s: float) -> float:
        """Seconds a stage capped at ``stage_s`` may use now."""
        return max(0.0, min(stage_s, self._deadline - asyncio.get_running_loop().time()))


Stage = tuple[str, Callable[[float], Awaitable[Any]], float]  # (name, step(seconds it may use), cap s)


async def staged_stop(who: str, stages: list[Stage], budget: StopBudget, logger: logging.Logger) -> None:
    """The one staged stop of the daemons (docs/architecture.md "Shutdown"): run each stage in order,
    each ``step(t)`` given and bounded by ``t`` = its cap or what is left of ``budget`` (at least
    0.1 s, so a late stage still gets a try). A stage that overruns is logged ("stop overran", with
    ``who`` and the stage) and the next one runs; one that raises is logged ("stop stage failed")
    and the next one runs: a stop never ends half-way."""
    for name, step, cap in stages:
        t = max(0.1, budget.take(cap))
        try:
            async with asyncio.timeout(t):
                await step(t)
        except TimeoutError:
            event(logger, logging.WARNING, "stop overran", daemon=who, stage=name, budget_s=round(t, 2))
        except Exception as e:
            event(logger, logging.ERROR, "stop stage failed", daemon=who, stage=name, error=repr(e))
