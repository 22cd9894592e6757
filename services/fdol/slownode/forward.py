"""Each local rank's forward time against its own baseline (faultmesh rules; reference fdol.md §4
has no such rule): the suspects that keep communication profiling on, and a node's forward rise.

:class:`ForwardTimes` is fed every step of the node's ranks (:meth:`ForwardTimes.add`) and judged
once a round (:meth:`ForwardTimes.judge`); :class:`fdol.slownode.node.NodeDetector` owns one per run.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import deque

from .metrics import StepMetrics
from .pattern import compute_value


class ForwardTimes:
    """Per rank: the compute baseline (``baseline``: the median of its first ``normal`` steps'
    forward -- ``fwd_min``, else the step's compute, :func:`fdol.slownode.pattern.compute_value` --
    in ns; with ``faultmesh`` off the compute value only), its relative spread (``spread``: IQR /
    1.349 / median) and, with ``faultmesh``, the forward times of the last ``window`` steps."""

    def __init__(self, ranks: list[int], normal: int, window: int, faultmesh: bool) -> None:
        self.faultmesh = faultmesh
        self.normal = normal
        self.window = window
        self.baseline: dict[int, float] = {}
        self.spread: dict[int, float] = {}
        self._buf: dict[int, list[float]] = {r: [] for r in ranks}
        # each rank's forward time of its last ``window`` steps, as the suspects / the node's
        # forward rise read it (0: not measured)
        self._any: dict[int, deque[float]] = {r: deque(maxlen=window) for r in ranks}
        self._rise: dict[int, deque[float]] = {r: deque(maxlen=window) for r in ranks}

    def add(self, m: StepMetrics) -> None:
        """One step of a local rank (in order)."""
        if self.faultmesh:  # the forward times the rounds judge (0: not measured)
            self._any[m.rank].append(m.fwd_min or compute_value(m))
            self._rise[m.rank].append((m.fwd_min or m.compute) if m.compute > 0 else 0)
        if m.rank in self.baseline:
            return
        cv = (m.fwd_min or compute_value(m)) if self.faultmesh else compute_value(m)
        if cv > 0:
            buf = self._buf[m.rank]
            buf.append(cv)
            if len(buf) >= self.normal:
                med = self.baseline[m.rank] = statistics.median(buf)
                if len(buf) >= 4:  # the relative spread of the baseline steps (IQR / 1.349)
                    q1, _, q3 = statistics.quantiles(buf, n=4)
                    self.spread[m.rank] = (q3 - q1) / 1.349 / med
                self._buf[m.rank] = []

    def judge(self, ranks: list[int], skip: set[int], node_rise: float) -> tuple[list[int], float | None]:
        """Forward times of the last ``window`` steps against each rank's baseline -> (suspects,
        node forward rise).

        - suspects: ranks not in ``skip`` whose forward time (``fwd_min``, else the step's compute;
          window median) rose ``node_rise`` (``nodeRise``): with communication profiling off they
          keep it (or switch it) on and keep a confirmed degradation from recovering unseen (wait
          asymmetry needs TP collectives);
        - forward rise: the *smallest* over the ranks of the window's lower quartile over the
          baseline (``fwd_min``, else the forward sum; ranks with a full window of forwards; None
          without): a node computing uniformly slower raises every member's forward; a member
          that starts late — after a slow PP receive or send — shows a shorter forward than its
          peers; OS hiccups and checkpoints only ever add time."""
        need = 1 + node_rise
        suspects = []
        ratios = []
        for r in ranks:
            b = self.baseline.get(r)
            if not b:
                continue
            if r not in skip:
                vals = sorted(self._any[r])
                vals = vals[bisect_right(vals, 0) :]
                if vals:
                    h = len(vals) // 2
                    med = vals[h] if len(vals) % 2 else (vals[h - 1] + vals[h]) / 2
                    if med / b >= need:
                        suspects.append(r)
            fw = sorted(self._rise[r])
            fw = fw[bisect_right(fw, 0) :]
            if len(fw) >= self.window:
                ratios.append(fw[len(fw) // 4] / b)
        return suspects, (round(min(ratios), 4) if ratios else None)
