"""A stand-in of TaskD's fault check, the client that reads deviced's reset-config files.

It follows the reference's source, read for behaviour (component/taskd/taskd/python/toolkit/
fault_checker/fault_check.py ``FaultProcessor``, and the agent loop that uses it,
framework/agent/ms_mgr/msrun_plugin.py ``MSRunPlugin.start``):

- the file is ``reset.json`` (+ ``restartType``) of the job's reset-config folder; a value of the
  wrong type is ignored, ``RankList`` entries that are not objects are dropped, the rest sorted by
  ``RankId`` (``_get_reset_info_from_cm``);
- ``wait_to_start``: remember RetryTime as the last one acted on; no start while ``FaultFlushing`` or
  while a local rank is listed with Status ``fault``;
- each loop (``get_fault_status``): *retried* when ``RetryTime > pre_retry_time``; when the RankList
  differs from the one last acted on, *fault* for a local rank with Status ``fault`` and
  *unrecovered* for any rank with Status ``unrecovered`` or ``recovered``;
- then, in the loop's order: ``GracefulExit == 1`` stops the workers; *fault* stops them and the
  agent exits; *retried* and not *unrecovered*: once every rank is recovered, the workers restart and
  the RankList last acted on is emptied (``update_fault_info``); *unrecovered*: the workers stop, and
  restart once every listed rank reads ``recovered`` (which records RetryTime and the RankList as
  acted on, ``is_recovered``).

The workers are the callers' ``start_workers`` / ``stop_workers`` (the tests set the processes on
the simulated chips). ``restarts`` counts the restarts after a stop; ``seen`` logs each decision.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ResetInfo:
    """What the client takes from the files (reference ``ResetCmData``)."""

    fault_ranks: list[dict]
    retry_time: int
    grace_exit: int
    restart_type: str
    fault_flush: bool


def read_reset_info(folder: Path) -> ResetInfo:
    """Read ``folder``/reset.json and restartType the way the client does (bad values ignored)."""
    try:
        doc = json.loads((folder / "reset.json").read_text())
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    try:
        restart_type = (folder / "restartType").read_text().strip()
    except OSError:
        restart_type = ""

    def typed(key, typ, default):
        v = doc.get(key)
        return v if isinstance(v, typ) else default

    ranks = [r for r in typed("RankList", list, []) if isinstance(r, dict)]
    ranks.sort(key=lambda r: r.get("RankId", 0))
    return ResetInfo(ranks, typed("RetryTime", int, 0), typed("GracefulExit", int, 0), restart_type,
                     typed("FaultFlushing", bool, False))  # fmt: skip


class FaultCheck:
    """The client of one node: ``local_ranks`` are its global ranks (see module docstring)."""

    def __init__(
        self,
        folder: Path,
        local_ranks: list[int],
        start_workers: Callable[[], None],
        stop_workers: Callable[[], None],
    ) -> None:
        self.folder = folder
        self.local_ranks = local_ranks
        self.start_workers = start_workers
        self.stop_workers = stop_workers
        self.pre_retry_time = 0
        self.retry_time = 0
        self.pre_fault_ranks: list[dict] = []
        self.fault_ranks: list[dict] = []
        self.grace_exit = 0
        self.running = False
        self.exited = False
        self.restarts = 0
        self.seen: list[str] = []

    def wait_to_start(self) -> bool:
        """True when the workers may start (and starts them)."""
        info = read_reset_info(self.folder)
        self.pre_retry_time = info.retry_time
        if info.fault_flush:
            return False
        for r in info.fault_ranks:
            if r.get("RankId") in self.local_ranks and r.get("Status") == "fault":
                return False
        self.start_workers()
        self.running = True
        return True

    def fault_status(self) -> tuple[bool, bool, bool]:
        """(fault, unrecovered, retried) from the files now."""
        info = read_reset_info(self.folder)
        self.fault_ranks, self.retry_time, self.grace_exit = (
            info.fault_ranks,
            info.retry_time,
            info.grace_exit,
        )
        fault = unrecovered = False
        retried = self.retry_time > self.pre_retry_time
        if self.pre_fault_ranks != self.fault_ranks:
            for r in self.fault_ranks:
                if "Status" not in r:
                    continue
                if r["Status"] == "fault" and r.get("RankId") in self.local_ranks:
                    fault = True
                if r["Status"] in ("unrecovered", "recovered"):
                    unrecovered = True
        return fault, unrecovered, retried

    def all_recovered(self) -> bool:
        """Every listed rank reads recovered: RetryTime and the RankList become the ones acted on."""
        if any(r.get("Status") != "recovered" for r in self.fault_ranks if "Status" in r):
            return False
        self.pre_retry_time = self.retry_time
        self.pre_fault_ranks = self.fault_ranks
        return True

    def _stop(self) -> None:
        if self.running:
            self.stop_workers()
            self.running = False

    def _restart(self, why: str) -> None:
        self._stop()
        self.start_workers()
        self.running = True
        self.restarts += 1
        self.seen.append(f"restart ({why}) retry_time={self.retry_time}")

    def check(self) -> None:
        """One turn of the agent loop (see module docstring)."""
        if self.exited:
            return
        fault, unrecovered, retried = self.fault_status()
        if self.grace_exit == 1:
            self._stop()
            self.seen.append("grace exit")
            return
        if fault:
            self._stop()
            self.exited = True
            self.seen.append("local rank fault: exit")
            return
        if retried and not unrecovered:
            if self.all_recovered():
                self._restart("retried")
                self.pre_retry_time, self.pre_fault_ranks = self.retry_time, []
            return
        if unrecovered:
            if self.running:
                self.seen.append(f"stop (unrecovered) retry_time={self.retry_time}")
            self._stop()
            if self.all_recovered():
                self._restart("recovered")

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """The agent loop in a thread: start once allowed, then ``check`` every ``interval_s``."""
        while not stop.is_set() and not self.wait_to_start():
            stop.wait(interval_s)
        while not stop.wait(interval_s):
            self.check()
