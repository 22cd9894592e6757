"""Shared test fixtures: free loopback ports, the shared data folder, uvloop for async tests."""

from __future__ import annotations

import asyncio
import asyncio.runners
import gc
import sys
import threading
import time
import weakref
from collections import Counter
from pathlib import Path

import pytest
import uvloop
from support import FAULT_TABLES, ClusterdProcess, free_port


def pytest_asyncio_loop_factories(config, item):
    """Run async tests on uvloop, as the daemons do."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def fault_tables() -> Path:
    """../shared/data/fault-tables (read-only reference tables)."""
    if not FAULT_TABLES.is_dir():
        pytest.skip("../shared/data/fault-tables not present")
    return FAULT_TABLES


@pytest.fixture
def clusterd_process(tmp_path):
    """Factory: ``clusterd_process(*extra_flags)`` starts a real clusterd; all are stopped at teardown."""
    procs: list[ClusterdProcess] = []

    def start(*extra: str, state_dir: Path | None = None) -> ClusterdProcess:
        p = ClusterdProcess(state_dir or tmp_path / "state", list(extra)).start()
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture(autouse=True)
def _controller_moves_legal():
    """Fail a test during which a recovery controller of this process made a move its state table
    does not allow (issue 28: :mod:`clusterd.brain.states` counts them, production only logs them).
    Every flow a test drives is walked against the table this way."""
    states = sys.modules.get("clusterd.brain.states")
    before = Counter(states.ILLEGAL) if states is not None else Counter()
    yield
    states = sys.modules.get("clusterd.brain.states")
    new = (Counter(states.ILLEGAL) - before) if states is not None else Counter()
    if new:
        moves = ", ".join(f"{a} -> {b} x{n}" for (a, b), n in sorted(new.items()))
        pytest.fail(f"recovery controller moves the state table does not allow: {moves}", pytrace=False)


# -- leak guard: a test that leaves tasks or threads behind fails (issue 12; anchors §7, HA verify_cleanup)
_LEAKED_TASKS: list[str] = []
CANCEL_WAIT_S = 10.0
_orig_cancel_all_tasks = asyncio.runners._cancel_all_tasks


def _cancel_all_tasks_and_record(loop):
    """pytest-asyncio's Runner cancels what is still running when the test's loop closes (after
    every fixture's teardown): whatever is still pending then was left behind by the test."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done() and not _library_internal(t)]
    _LEAKED_TASKS.extend(f"{t.get_name()} {t.get_coro()!r}" for t in pending)
    everything = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in everything:
        t.cancel()
    stuck: set = set()
    if everything:  # bounded: a task that ignores its cancellation fails the test instead of hanging the run
        _, stuck = loop.run_until_complete(asyncio.wait(everything, timeout=CANCEL_WAIT_S))
        _LEAKED_TASKS.extend(f"{t.get_name()} {t.get_coro()!r} ignored its cancellation" for t in stuck)
    return None if stuck else _orig_cancel_all_tasks(loop)


def _library_internal(task: asyncio.Task) -> bool:
    """grpc.aio's own tasks (Cython coroutines: a stopped server's handler tasks end a moment after
    ``server.stop``) belong to grpc, not to the code under test."""
    return type(task.get_coro()).__module__.startswith("_cython")


asyncio.runners._cancel_all_tasks = _cancel_all_tasks_and_record


def _live_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and not t.daemon and not _of_closed_pool(t)}


def _of_closed_pool(t: threading.Thread) -> bool:
    """A worker of a ThreadPoolExecutor that was shut down: it ends when its current call returns
    (a BlockingPool call that timed out is left to finish in its thread by design)."""
    args = getattr(t, "_args", ())
    ref = args[0] if args else None
    pool = ref() if callable(ref) and isinstance(ref, weakref.ref) else None
    return (
        ref is not None
        and isinstance(ref, weakref.ref)
        and (pool is None or getattr(pool, "_shutdown", False))
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Fail a test (at teardown) that left asyncio tasks running or non-daemon threads alive."""
    before = item.stash.get(_THREADS_KEY, set())
    _LEAKED_TASKS.clear()
    result = yield
    tasks = list(_LEAKED_TASKS)
    _LEAKED_TASKS.clear()
    extra = _live_threads() - before
    if extra:  # a full collection costs ~0.2 s in this big process: only when a thread is left to explain
        gc.collect()  # an unreferenced ThreadPoolExecutor wakes its idle workers to exit when collected
        extra = _live_threads() - before
    deadline = time.monotonic() + 3.0
    while extra and time.monotonic() < deadline:
        time.sleep(0.05)
        extra = {t for t in extra if t.is_alive()}
    problems = [f"task left running: {t}" for t in tasks]
    problems += [f"thread left alive: {t.name}" for t in extra]
    if problems:
        pytest.fail("test left work behind:\n  " + "\n  ".join(problems), pytrace=False)
    return result


_THREADS_KEY = pytest.StashKey[set]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_THREADS_KEY] = _live_threads()
