"""A live progress line for CLI commands that wait (``stress-test``, ``switch-nic``; issue 17).

:func:`wait_with_progress` runs a blocking call in a daemon thread and, while it runs, shows on
stderr

- on a terminal: a rich spinner with the elapsed time (``⠋ stress-test demo-job: waiting for the
  outcome  0:00:07``), removed when the call returns;
- otherwise (a pipe, a log file, CI): plain lines, one when the wait starts and one every
  ``every_s`` seconds (``stress-test demo-job: still waiting for the outcome (30 s of at most 3600 s)``).

stdout stays for the result (a table, JSON or YAML), so ``-o json | jq`` keeps working.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _run_in_thread(fn: Callable[[], T]) -> tuple[threading.Event, list[Any]]:
    done = threading.Event()
    box: list[Any] = []

    def work() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # handed to the caller's thread
            box.append((False, e))
        finally:
            done.set()

    # daemon: Ctrl-C ends the command without waiting for the blocked gRPC call
    threading.Thread(target=work, name="cli-wait", daemon=True).start()
    return done, box


def wait_with_progress(
    what: str, fn: Callable[[], T], timeout_s: float, out=None, every_s: float = 30.0, tick_s: float = 0.1
) -> T:
    """``fn()`` (a blocking call that ends by itself within about ``timeout_s`` seconds), with a
    progress line on ``out`` (default ``sys.stderr``) while it runs. ``what`` names the wait
    (``stress-test demo-job``). Returns what ``fn`` returned; re-raises what it raised."""
    out = out if out is not None else sys.stderr
    done, box = _run_in_thread(fn)
    t0 = time.monotonic()
    if hasattr(out, "isatty") and out.isatty():
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        cols = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*cols, console=Console(file=out), transient=True) as progress:
            progress.add_task(f"{what}: waiting for the outcome (at most {timeout_s:.0f} s)", total=None)
            while not done.wait(tick_s):
                pass
    else:
        out.write(f"{what}: waiting for the outcome (at most {timeout_s:.0f} s)\n")
        out.flush()
        next_line = every_s
        while not done.wait(tick_s):
            elapsed = time.monotonic() - t0
            if elapsed >= next_line:
                out.write(
                    f"{what}: still waiting for the outcome ({elapsed:.0f} s of at most {timeout_s:.0f} s)\n"
                )
                out.flush()
                next_line += every_s
    ok, value = box[0]
    if not ok:
        raise value
    return value
