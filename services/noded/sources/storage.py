"""DPC and DTFS shared-storage sources: status files polled every 5 s, sent as node faults.

Source: reference noded.md §5 and §7; issue 12 (:class:`Dpc` and :class:`Dtfs` are
:class:`faultmesh.source.PolledSource` s; the file is read in the bounded pool with the poll timeout).

DPC (``dpc_status_check``): blocks of ``[instidx=N]`` / ``DPC_INTERNAL_ERROR: V`` /
``DPC_PROCESS_ERROR: V``. INTERNAL 0 = healthy, -12 = out of memory; PROCESS 0 = healthy,
-1 = process abnormal; any other value or a malformed block fails the whole read (counted,
rate-limited log, state unchanged).

- process fault ``110001020`` = some instance has a process error (immediate);
- memory fault ``110001021`` turns on when some instance has had its memory error for
  ``memory_hold_s`` (10 min) without a break, and off only when every instance has been clear for
  10 min.

DTFS (``dtfs_status_check``): ``[instidx=N]`` / ``DTFS_PROCESS_ERROR: 0|-1`` /
``DTFS_LINK_ERROR: 0|-1``, OR over instances, no hysteresis, an empty file is an error. Codes
``110001022`` (process), ``110001023`` (link).

The file must be a regular file owned by root (or by noded's own user) with none of the mode bits
0133, as in the reference. Faults are node faults (device type ``Node``, id -1) with the
reference's stable fault id ``sha256("<node>/<DPC_PROCESS|...>")`` as attribute ``fault_id``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from faultmesh.log import RateLimitedLog, event
from faultmesh.model import NODE_DEVICE_ID, Fault, now_ms
from faultmesh.source import PolledSource, Support
from noded.metrics import NodedMetrics
from noded.sections import StorageConfig

log = logging.getLogger("noded.storage")

DPC_PROCESS_CODE = "110001020"
DPC_MEMORY_CODE = "110001021"
DTFS_PROCESS_CODE = "110001022"
DTFS_LINK_CODE = "110001023"
# ClusterD's default levels for these public fault codes (reference clusterd publicFaultConfiguration).
STORAGE_LEVELS = {
    DPC_PROCESS_CODE: "SubHealthFault",
    DPC_MEMORY_CODE: "SubHealthFault",
    DTFS_PROCESS_CODE: "PreSeparateNPU",
    DTFS_LINK_CODE: "PreSeparateNPU",
}
FAULT_ID_SUFFIX = {
    DPC_PROCESS_CODE: "DPC_PROCESS",
    DPC_MEMORY_CODE: "DPC_MEMORY",
    DTFS_PROCESS_CODE: "DTFS_PROCESS",
    DTFS_LINK_CODE: "DTFS_LINK",
}
MEMORY_HOLD_S = 600.0
MAX_FILE_BYTES = 64 << 10
_INST_RE = re.compile(r"^\[instidx=(\d+)\]$")
_KV_RE = re.compile(r"^(\w+):\s*(-?\d+)$")


class StatusFileError(ValueError):
    """A status file that cannot be used; ``reason``: missing, unsafe, too-big, empty, format, value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def parse_status(
    text: str, keys: tuple[str, str], allowed: tuple[set[int], set[int]]
) -> dict[int, tuple[int, int]]:
    """Parse 3-line blocks ``[instidx=N]`` / ``keys[0]: V`` / ``keys[1]: V`` -> {N: (V0, V1)}.

    Blank lines are skipped; keys must appear in this order; values must be in ``allowed``.
    Raises :class:`StatusFileError` (``format`` or ``value``).
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) % 3:
        raise StatusFileError("format", f"{len(lines)} lines is not a whole number of 3-line blocks")
    out: dict[int, tuple[int, int]] = {}
    for i in range(0, len(lines), 3):
        m = _INST_RE.match(lines[i])
        if not m:
            raise StatusFileError("format", f"line {lines[i]!r} is not [instidx=N]")
        vals = []
        for j, key in enumerate(keys):
            kv = _KV_RE.match(lines[i + 1 + j])
            if not kv or kv.group(1) != key:
                raise StatusFileError("format", f"expected '{key}: <int>', got {lines[i + 1 + j]!r}")
            v = int(kv.group(2))
            if v not in allowed[j]:
                raise StatusFileError("value", f"{key} value {v} is not one of {sorted(allowed[j])}")
            vals.append(v)
        out[int(m.group(1))] = (vals[0], vals[1])
    return out


def read_status_file(path: str) -> str:
    """Read a status file after the reference's safety checks. Raises :class:`StatusFileError`."""
    try:
        st = os.lstat(path)
        target = os.stat(path) if stat.S_ISLNK(st.st_mode) else st
    except FileNotFoundError:
        raise StatusFileError("missing", f"{path} does not exist") from None
    except OSError as e:
        raise StatusFileError("missing", f"{path}: {e}") from None
    trusted = {0, os.getuid()}
    if st.st_uid not in trusted or target.st_uid not in trusted:
        raise StatusFileError("unsafe", f"{path} is owned by uid {target.st_uid}, not root")
    if not stat.S_ISREG(target.st_mode) or target.st_mode & 0o133:
        raise StatusFileError(
            "unsafe", f"{path} has mode {oct(target.st_mode & 0o7777)} (must not have 0133)"
        )
    if target.st_size > MAX_FILE_BYTES:
        raise StatusFileError("too-big", f"{path} is {target.st_size} bytes")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise StatusFileError("missing", f"{path}: {e}") from None


def fault_id(node: str, code: str) -> str:
    """The reference's stable fault id: sha256 hex of ``<node>/<DPC_PROCESS|DPC_MEMORY|...>``."""
    return hashlib.sha256(f"{node}/{FAULT_ID_SUFFIX[code]}".encode()).hexdigest()


@dataclass
class _Inst:
    mem_error: bool = False
    since: float = 0.0  # when mem_error last flipped (monotonic s)


class DpcEvaluator:
    """DPC decision with the 10-minute memory hysteresis; ``clock`` is monotonic seconds.

    :meth:`update` takes {instance: (internal, process)} and returns the active codes.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, memory_hold_s: float = MEMORY_HOLD_S
    ) -> None:
        self.clock = clock
        self.memory_hold_s = memory_hold_s
        self.insts: dict[int, _Inst] = {}
        self.memory_fault = False
        self.process_fault = False

    def update(self, status: dict[int, tuple[int, int]]) -> set[str]:
        """One successful read: {instance: (internal, process)} -> active codes (110001020/21)."""
        now = self.clock()
        for idx, (internal, _process) in status.items():
            err = internal == -12
            inst = self.insts.get(idx)
            if inst is None:
                self.insts[idx] = _Inst(err, now)
            elif inst.mem_error != err:
                inst.mem_error, inst.since = err, now
        for idx, inst in list(self.insts.items()):
            if idx not in status:  # a vanished instance counts as clear since it vanished
                if inst.mem_error:
                    inst.mem_error, inst.since = False, now
                elif now - inst.since >= self.memory_hold_s:
                    del self.insts[idx]
        self.process_fault = any(p == -1 for _i, p in status.values())
        if not self.memory_fault:
            self.memory_fault = any(
                i.mem_error and now - i.since >= self.memory_hold_s for i in self.insts.values()
            )
        else:
            self.memory_fault = not all(
                (not i.mem_error) and now - i.since >= self.memory_hold_s for i in self.insts.values()
            )
        codes = set()
        if self.process_fault:
            codes.add(DPC_PROCESS_CODE)
        if self.memory_fault:
            codes.add(DPC_MEMORY_CODE)
        return codes

    def pending_memory(self) -> bool:
        """True while some instance has a memory error not yet held for the full period."""
        return any(i.mem_error for i in self.insts.values()) and not self.memory_fault


class StorageSource(PolledSource):
    """Polls one status file (``kind`` ``dpc`` or ``dtfs``, also the source name and the faults'
    source) every ``interval_s`` and keeps that source's node faults current. A file that cannot be
    used is a failed poll: counted in ``faultmesh_noded_storage_reads_total{monitor,result}``, logged
    (rate-limited), the previous faults kept. Subclasses :class:`Dpc` / :class:`Dtfs` set ``kind``.
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    timeout_s = 5.0
    Config = StorageConfig  # its section (noded.sources.config_section), one for both kinds

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        """``--dpc-status-file``, ``--dtfs-status-file``, ``--storage-interval``,
        ``--storage-memory-hold-s`` (one set for both)."""
        p.add_argument(
            "--dpc-status-file", help="DPC status file, e.g. /user/mind-cluster/dpcstatus/dpc_status_check"
        )
        p.add_argument(
            "--dtfs-status-file",
            help="DTFS status file, e.g. /user/mind-cluster/dtfsstatus/dtfs_status_check",
        )
        p.add_argument("--storage-interval", type=float, default=5.0, help="DPC/DTFS poll period (s)")
        p.add_argument(
            "--storage-memory-hold-s",
            type=float,
            default=MEMORY_HOLD_S,
            help="a DPC memory error must last (and clear) this long before it is raised (cleared) (s)",
        )

    @classmethod
    def from_config(cls, cfg: StorageConfig, metrics: NodedMetrics) -> StorageSource:
        """The source for the storage section ``cfg`` (path ``<kind>_status_file``, may be empty)."""
        return cls(
            cfg.status_file(cls.kind),
            metrics,
            interval_s=cfg.storage_interval,
            memory_hold_s=cfg.storage_memory_hold_s,
        )

    def __init__(
        self,
        path: str,
        metrics: NodedMetrics,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = now_ms,
        memory_hold_s: float = MEMORY_HOLD_S,
    ) -> None:
        if self.kind not in ("dpc", "dtfs"):
            raise ValueError(f"storage source kind must be dpc or dtfs, got {self.kind!r}")
        super().__init__()
        self.path = path
        self.metrics = metrics
        self.interval_s = interval_s
        self.timeout_s = max(1.0, min(interval_s, 5.0))
        self.wall_ms = wall_ms
        self.dpc = DpcEvaluator(clock, memory_hold_s)
        self.codes: set[str] = set()
        self.reads_ok = 0
        self._faults: list[Fault] = []
        self._ratelog = RateLimitedLog(log, period_s=300.0, clock=clock)

    def supported(self) -> Support:
        """Runs when its status file is configured."""
        if not self.path:
            return Support(False, f"--{self.kind}-status-file not set")
        return Support(True)

    @property
    def state(self):
        """The agent state of the context."""
        assert self.ctx is not None, f"{self.kind} source used without ctx"
        return self.ctx.state

    def evaluate(self, text: str) -> set[str]:
        """Status file text -> active codes. Raises :class:`StatusFileError`."""
        if self.kind == "dpc":
            status = parse_status(text, ("DPC_INTERNAL_ERROR", "DPC_PROCESS_ERROR"), ({0, -12}, {0, -1}))
            return self.dpc.update(status)
        if not text.strip():
            raise StatusFileError("empty", "DTFS status file is empty")
        status = parse_status(text, ("DTFS_PROCESS_ERROR", "DTFS_LINK_ERROR"), ({0, -1}, {0, -1}))
        codes = set()
        if any(p == -1 for p, _l in status.values()):
            codes.add(DTFS_PROCESS_CODE)
        if any(lk == -1 for _p, lk in status.values()):
            codes.add(DTFS_LINK_CODE)
        return codes

    async def poll(self) -> list[Fault]:
        """Read the file in the pool and evaluate it: the full fault set. Raises
        :class:`StatusFileError` (counted and logged)."""
        assert self.ctx is not None
        try:
            text = await self.ctx.run_blocking(self.timeout_s, read_status_file, self.path)
            codes = self.evaluate(text)
        except StatusFileError as e:
            self._count_error(e)
            raise
        return self._faults_for(codes)

    def check(self) -> bool:
        """One synchronous read and publish (tests); True when the fault set changed. Errors keep
        the previous state."""
        try:
            codes = self.evaluate(read_status_file(self.path))
        except StatusFileError as e:
            self._count_error(e)
            return False
        faults = self._faults_for(codes)
        return self.state.replace_source(self.kind, faults)

    def _count_error(self, e: StatusFileError) -> None:
        self.metrics.storage_reads.labels(self.kind, e.reason).inc()
        self._ratelog.warning(
            f"{self.kind}-{e.reason}",
            "storage status read failed",
            monitor=self.kind,
            path=self.path,
            error=str(e),
        )

    def _faults_for(self, codes: set[str]) -> list[Fault]:
        """Count the read, log what changed and return the faults of ``codes`` (the same records
        while the codes stay the same)."""
        self.metrics.storage_reads.labels(self.kind, "ok").inc()
        self.reads_ok += 1
        if codes == self.codes and self.reads_ok > 1:
            return self._faults
        added, removed = codes - self.codes, self.codes - codes
        self.codes = codes
        now = self.wall_ms()
        node = self.ctx.node if self.ctx is not None else ""
        resource = "dpcStorage" if self.kind == "dpc" else "dtfsStorage"
        self._faults = [
            Fault(
                self.kind,
                node,
                "Node",
                NODE_DEVICE_ID,
                c,
                STORAGE_LEVELS[c],
                first_seen_ms=now,
                last_seen_ms=now,
                attributes={"fault_id": fault_id(node, c), "resource": resource},
            )
            for c in sorted(codes)
        ]
        for lv in sorted(set(STORAGE_LEVELS.values())):
            self.metrics.faults.labels(self.kind, lv).set(sum(1 for f in self._faults if f.level == lv))
        for c in sorted(added):
            event(log, logging.WARNING, "storage fault occur", monitor=self.kind, code=c)
        for c in sorted(removed):
            event(log, logging.INFO, "storage fault recover", monitor=self.kind, code=c)
        return self._faults


class Dpc(StorageSource):
    """The DPC status file source (codes 110001020 process, 110001021 memory with hysteresis)."""

    kind = name = "dpc"


class Dtfs(StorageSource):
    """The DTFS status file source (codes 110001022 process, 110001023 link)."""

    kind = name = "dtfs"
