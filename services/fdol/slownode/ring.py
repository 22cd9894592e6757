"""A preallocated ring of [members, ops] float32 columns (the gap rule's window, :mod:`.peers`)."""

from __future__ import annotations

import numpy as np


class Ring:
    """A group's [members, ops] excess columns, chronological, in one preallocated float32 buffer:
    a round appends its new steps' columns and the window is a view (no copy of the window per
    round; the buffer is compacted when full)."""

    __slots__ = ("buf", "start", "end")

    def __init__(self, members: int) -> None:
        self.buf = np.empty((members, 0), np.float32)
        self.start = self.end = 0

    def view(self) -> np.ndarray:
        """The kept columns [members, ops] (a view: valid until the next :meth:`push`)."""
        return self.buf[:, self.start : self.end]

    def push(self, cols: list[np.ndarray], keep: int) -> None:
        """Append ``cols`` (each [members, k]) and keep the last ``keep`` columns."""
        k = sum(c.shape[1] for c in cols)
        if self.end + k > self.buf.shape[1]:
            old = max(0, min(keep - k, self.end - self.start))
            cap = max(self.buf.shape[1], 4 * max(keep, k))
            buf = self.buf if cap == self.buf.shape[1] else np.empty((self.buf.shape[0], cap), np.float32)
            buf[:, :old] = self.buf[:, self.end - old : self.end]  # overlapping: numpy copies first
            self.buf, self.start, self.end = buf, 0, old
        for c in cols:
            self.buf[:, self.end : self.end + c.shape[1]] = c
            self.end += c.shape[1]
        self.start = max(self.start, self.end - keep)
