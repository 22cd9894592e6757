"""Timestamped progress lines and the demo's summary table.

A :class:`Row` is one expected detection: the fault, when it was injected, when clusterd showed
it (wall clock, ms), what clusterd decided, and the verdict: ``right``, ``wrong``, ``missing``
(nothing seen before the deadline) or ``not available`` (the part is not installed).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

RIGHT, WRONG, MISSING, NOT_AVAILABLE = "right", "wrong", "missing", "not available"


class Clock:
    """Wall clock and offset from the demo's start; ``say`` prints ``HH:MM:SS.mmm +SSS.Ss  msg``.

    With :meth:`tee`, everything printed also goes to a file (the demo's own log, ``logs/demo.log``).
    """

    def __init__(self, out=sys.stdout) -> None:
        self.t0 = time.time()
        self.out = out
        self.copy = None

    def tee(self, path) -> None:
        """Also append every line printed from now on to ``path`` (line-buffered)."""
        self.copy = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the run

    def print(self, text: str = "") -> None:
        """Print ``text`` (and a newline) to the terminal and the tee file."""
        self.out.write(text + "\n")
        self.out.flush()
        if self.copy is not None:
            self.copy.write(text + "\n")

    def now(self) -> float:
        """Wall clock (s since the epoch)."""
        return time.time()

    def stamp(self, t: float | None) -> str:
        """``HH:MM:SS.m (+S.Ss)`` for wall time ``t`` (s), ``-`` for None."""
        if t is None:
            return "-"
        lt = time.localtime(t)
        return f"{time.strftime('%H:%M:%S', lt)}.{int((t % 1) * 10)} (+{t - self.t0:.1f}s)"

    def say(self, msg: str) -> None:
        """Print one progress line with the wall time and the offset from the start."""
        t = time.time()
        lt = time.localtime(t)
        self.print(f"{time.strftime('%H:%M:%S', lt)}.{int((t % 1) * 1000):03d} +{t - self.t0:6.1f}s  {msg}")


@dataclass(eq=False)  # identity: rows are keys of per-step bookkeeping
class Row:
    """One line of the summary. Times are wall clock in s (None when not applicable)."""

    fault: str
    injected: float | None = None
    detected: float | None = None
    decided: str = ""
    verdict: str = MISSING
    note: str = ""

    @property
    def latency(self) -> float | None:
        """Detected − injected (s), or None."""
        if self.injected is None or self.detected is None:
            return None
        return self.detected - self.injected


def table(rows: list[Row], clock: Clock) -> str:
    """The summary as an aligned text table (one line per row, notes on following lines)."""
    head = ("#", "fault", "injected at", "detected at", "latency", "clusterd decided", "result")
    cells = [head]
    for i, r in enumerate(rows, 1):
        lat = "-" if r.latency is None else f"{r.latency:.1f} s"
        cells.append(
            (
                str(i),
                r.fault,
                clock.stamp(r.injected),
                clock.stamp(r.detected),
                lat,
                r.decided,
                r.verdict.upper(),
            )
        )
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [f"  #{i}: {r.note}" for i, r in enumerate(rows, 1) if r.note]
    if notes:
        lines.append("")
        lines.append("notes:")
        lines.extend(notes)
    return "\n".join(lines)


def all_right(rows: list[Row]) -> bool:
    """True when every row is ``right`` (a ``not available`` part counts as a failure)."""
    return bool(rows) and all(r.verdict == RIGHT for r in rows)
