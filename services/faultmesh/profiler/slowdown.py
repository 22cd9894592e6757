"""The slowdown the example job injects into one rank (:mod:`faultmesh.profiler.example_job`):
per compute segment (the compute between two TP collectives), calibrated on the warm-up, and
re-scalable while the job runs through a factor file a test or an operator writes (issue 36)."""

from __future__ import annotations

import os
import statistics
import sys
import time


class Pace:
    """The compute segments of a step -- the compute between two TP collectives: ``f<i>`` layer
    i's forward, ``b<i>`` its backward (``all``: forward + backward, without ``--tp-in-forward``)
    -- and the slowdown of each.

    During warm-up (``recording``) :meth:`end` keeps each segment's wall and thread CPU time (ns);
    :meth:`calibrate` then sets per segment the extra ``tanh(x @ W)`` products worth ``factor`` x
    its median CPU time (``compute``: a card that runs every kernel ``factor`` slower) and the
    sleep worth ``factor`` x its median wall time (``sleep``: a stall); :meth:`set_factor` rescales
    both at run time (``--factor-file``). Afterwards :meth:`end` applies the slowdown of ``mode``
    (``none`` | ``compute`` | ``sleep``; others: none). Every segment's wall and CPU time, the
    slowdown included, add up in ``gap_ns`` / ``gap_cpu_ns`` and the wall times are kept in order
    in ``gaps_ns`` (reset by :meth:`new_step`): the compute between collectives that the gap rule
    judges, per step and per operation."""

    def __init__(self, torch, x, w) -> None:  # noqa: ANN001 - torch is imported in the worker
        self._torch, self._x, self._w = torch, x, w
        self.recording = False
        self.mode = "none"
        self.loader_sleep_s = 0.0
        self._t0 = self._c0 = 0
        self._seen: dict[str, list[tuple[int, int]]] = {}
        self._base: dict[str, tuple[float, float]] = {}  # segment -> (median wall ms, CPU ms)
        self.factor = 0.0
        self.n_extra: dict[str, int] = {}
        self.sleep_s: dict[str, float] = {}
        self.per_extra_cpu_ms = 0.0
        self.gap_ns = self.gap_cpu_ns = 0
        self.gaps_ns: list[int] = []

    def new_step(self) -> None:
        """A step starts: its gap sums restart."""
        self.gap_ns = self.gap_cpu_ns = 0
        self.gaps_ns = []

    def start(self) -> None:
        """A segment starts (after a TP collective, or at the forward range's start)."""
        self._t0, self._c0 = time.perf_counter_ns(), time.thread_time_ns()

    def end(self, seg: str) -> None:
        """Segment ``seg`` ends: add its slowdown (after warm-up), record it (warm-up) and add its
        time to the step's gap sums."""
        if not self.recording and self.mode == "compute":
            for _ in range(self.n_extra.get(seg, 0)):
                self._torch.tanh(self._x @ self._w)
        elif not self.recording and self.mode == "sleep":
            time.sleep(self.sleep_s.get(seg, 0.0))
        wall, cpu = time.perf_counter_ns() - self._t0, time.thread_time_ns() - self._c0
        if self.recording:
            self._seen.setdefault(seg, []).append((wall, cpu))
        self.gap_ns += wall
        self.gap_cpu_ns += cpu
        self.gaps_ns.append(wall)

    def calibrate(self, factor: float, skip: int) -> None:
        """Per-segment slowdowns from the recorded warm-up (its first ``skip`` steps left out)."""
        cpu0 = time.thread_time_ns()
        for _ in range(20):
            self._torch.tanh(self._x @ self._w)
        self.per_extra_cpu_ms = (time.thread_time_ns() - cpu0) / 20 / 1e6
        for seg, xs in self._seen.items():
            xs = xs[skip:] or xs
            self._base[seg] = (
                statistics.median(w for w, _ in xs) / 1e6,
                statistics.median(c for _, c in xs) / 1e6,
            )
        self.set_factor(factor)

    def set_factor(self, factor: float) -> None:
        """Slowdown of ``factor`` x each segment's warm-up median (CPU time for ``compute``, wall
        time for ``sleep``)."""
        self.factor = factor
        for seg, (wall_ms, cpu_ms) in self._base.items():
            self.n_extra[seg] = round(factor * cpu_ms / max(self.per_extra_cpu_ms, 1e-6))
            self.sleep_s[seg] = factor * wall_ms / 1000

    def summary(self) -> dict[str, dict[str, float]]:
        """{segment: {"extra": products, "sleep_ms": ms}}."""
        return {
            s: {"extra": n, "sleep_ms": round(self.sleep_s[s] * 1000, 3)} for s, n in self.n_extra.items()
        }


class FactorFile:
    """``--factor-file``: the slowdown factor a test or an operator sets while the job runs (one
    number, e.g. ``0.35``; re-read when the file's mtime or size changes, checked once a step).
    A value that is not a number in [0, 5] is logged and ignored."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None

    def poll(self) -> float | None:
        """-> the new factor, or None (no file, unchanged, or unreadable)."""
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
            key = (st.st_mtime_ns, st.st_size)
            if key == self._seen:
                return None
            self._seen = key
            with open(self.path) as f:
                text = f.read().strip()
        except OSError:
            return None
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 5.0:
            sys.stdout.write(f"factor file {self.path}: {text[:40]!r} is not a factor in [0, 5]; ignored\n")
            return None
        return value
