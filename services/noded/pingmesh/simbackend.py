"""The pure-Python hccsping backend on the fabric simulator (``--pingmesh-backend sim``; issue 6):
:class:`SimHccsping`, one node's view of a :class:`noded.pingmesh.fabric.Fabric`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from faultmesh.dcmi.hccsping import STATE_RUNNING, STATE_STOPPED, ChipInfo, DestStat, HccspingInfo, PingOp

if TYPE_CHECKING:
    from noded.pingmesh.fabric import Fabric


@dataclass
class _Task:
    op: PingOp
    started: float
    last_query: float
    rounds_total: int = 0


class SimHccsping:
    """:class:`faultmesh.dcmi.hccsping.HccspingBackend` for one node of a :class:`Fabric`
    (``--pingmesh-backend sim``).

    A running task pings every destination with ``pkt_send_num`` packets every ``task_interval``
    seconds; ``info`` returns the statistics of the rounds since the previous ``info`` call (at
    least one round). ``clock`` (s) is injectable for tests.
    """

    def __init__(self, fabric: Fabric, node: str, clock=time.monotonic) -> None:
        self.fabric = fabric
        self.node = node
        self.clock = clock
        self._tasks: dict[tuple[int, int], _Task] = {}
        self._resets_seen: dict[int, str | None] = {}
        self._lock = threading.Lock()

    def chips(self) -> list[ChipInfo]:
        """This node's chips from the fabric."""
        return self.fabric.chips(self.node)

    def _phys(self) -> set[int]:
        return {c.phy_id for c in self.chips()}

    def _check_reset(self, phy: int) -> None:
        rid = self.fabric.reset_id(self.node, phy)
        if rid is not None and self._resets_seen.get(phy) != rid:
            self._resets_seen[phy] = rid
            for t in (0, 1):
                self._tasks.pop((phy, t), None)

    def start(self, phy_id: int, op: PingOp) -> None:
        """Start (or replace) task ``op.task_id`` on the chip (validates ``op``)."""
        op.validate()
        if phy_id not in self._phys():
            raise ValueError(f"no chip with physical id {phy_id}")
        now = self.clock()
        with self._lock:
            self._check_reset(phy_id)
            self._tasks[(phy_id, op.task_id)] = _Task(op, now, now)

    def stop(self, phy_id: int, task_id: int) -> None:
        """Stop the task (no error when it was not running)."""
        with self._lock:
            self._tasks.pop((phy_id, task_id), None)

    def state(self, phy_id: int, task_id: int) -> int:
        """1 running, 0 stopped."""
        with self._lock:
            self._check_reset(phy_id)
            return STATE_RUNNING if (phy_id, task_id) in self._tasks else STATE_STOPPED

    def info(self, phy_id: int, task_id: int) -> HccspingInfo:
        """Statistics per destination since the last call (empty when the task is not running)."""
        with self._lock:
            self._check_reset(phy_id)
            task = self._tasks.get((phy_id, task_id))
            if task is None:
                return HccspingInfo()
            now = self.clock()
            rounds = max(1, int((now - task.last_query) // task.op.task_interval))
            task.last_query = now
            task.rounds_total += rounds
        op = task.op
        out = []
        for addr in op.dst_addrs:
            try:
                sdid = int(addr)
            except ValueError:
                sdid = -1
            suc, fail, delays = self.fabric.probe((self.node, phy_id), sdid, rounds * op.pkt_send_num)
            if suc:
                arr = np.asarray(delays)
                stats = [int(round(x)) for x in (arr.max(), arr.min(), arr.mean(), np.percentile(arr, 95))]
            else:
                stats = [-1, -1, -1, -1]
            out.append(DestStat(addr, suc, fail, *stats, rounds, task.rounds_total))
        return HccspingInfo(out)
