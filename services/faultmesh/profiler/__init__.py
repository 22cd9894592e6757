"""faultmesh.profiler: make a training job write the lightweight-profiling record format.

The format is the reference's TaskD output (../shared/reference/fdol.md §1), so FD-OL's reader
(:mod:`fdol.slownode.reader`) and the reference's parser both read it::

    prof = Profiler(rank=0)                       # <base>/<task id>/<rank>/<unix sec> files
    for n, batch in enumerate(loader):
        with prof.step(n):
            with prof.dataloader(): ...
            with prof.forward(): ...              # the compute of the step (FP marker)
            with prof.comm("AllReduce", "tp_group_1", count=1024, dtype="fp32"): ...
    prof.dump_group_info({"tp_group_1": ("tp", 0, [0, 1])})
    prof.close()

PyTorch integration (optional import): :mod:`faultmesh.profiler.torch` wraps ``torch.distributed``
collectives and writes ``parallel_group.json`` from the job's process groups.

Behaviour:
- Paths: base dir = ``base_dir`` or env ``FAULTMESH_PROFILING_DIR`` or ``/user/cluster-info/profiling``;
  task id = ``task_id`` or env ``MINDX_TASK_ID`` or ``default_task_id_<unix sec>``; rank dir mode
  0755, files 0644; data files named by their creation time in Unix seconds, a new one when the
  newest exceeds ``max_file_bytes`` (10 MiB).
- Records: step, forward and communication ranges write 4 records (host and device start/end, flags
  16/32); dataloader and save_checkpoint 2 host records (flags 2/4). Only the first record of an Id
  carries Name/Domain. Device timestamps are the host ones unless a ``device_timer`` is given: on a
  CPU job they are the same thing; on a GPU job ``device_timer=EventTimer.cuda()``
  (:mod:`faultmesh.profiler.device`) times step, forward and collective ranges with CUDA events,
  written at a later step boundary once the events completed (issue 33). A
  blocking collective's host range is the whole call, not its launch: gloo's launch time is
  bimodal (~0.1 ms, or several ms when the woken worker thread preempts the caller), and as
  ZP_host it made the slow-host rule follow the box's scheduling (measured on the 4-rank job at
  load 6-8: 51 node rounds naming a host in 2 clean runs against 0 in 2 with whole-call ranges).
- Switch: ``switch_path`` (or env ``FAULTMESH_PROFILING_SWITCH``) is polled at most every
  ``switch_poll_s`` (1 s) at step boundaries; its *default* domain gates step/forward/dataloader/
  save_checkpoint, its *communication* domain gates collectives; missing or invalid file = all off
  (reference §1.1). Without a switch path everything is on.
- Cost: records are encoded with orjson into memory and appended every ``flush_interval_s`` (5 s)
  at a step boundary; about 1 µs per record.
- Never breaks training: every file-system error (disk full, directory removed, permissions) is
  caught; the records of that flush are dropped and counted in ``dropped_records``; the directory
  is recreated at the next flush. The buffer is capped at ``max_buffered`` records.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from faultmesh.profiler.device import EventTimer
from fdol.slownode.records import (
    FLAG_DEVICE_END,
    FLAG_DEVICE_START,
    FLAG_HOST_END,
    FLAG_HOST_START,
    SOURCE_DEVICE,
    SOURCE_HOST,
)
from fdol.slownode.switch import parse_switch

DEFAULT_BASE = "/user/cluster-info/profiling"
MAX_FILE_BYTES = 10 * 1024 * 1024

__all__ = ["Profiler"]


class _Range:
    """Context manager of one marker range (reusable per call; cheap)."""

    __slots__ = ("_p", "_name", "_domain", "_device", "_rid", "_t0", "_on", "_ev0")

    def __init__(self, p: Profiler, name: str, domain: str, device: bool, on: bool) -> None:
        self._p = p
        self._name = name
        self._domain = domain
        self._device = device
        self._on = on

    def __enter__(self) -> _Range:
        if self._on:
            self._rid = next(self._p._ids)
            timer = self._p.device_timer
            if timer is not None and self._device:
                self._ev0 = timer.record()
            self._t0 = time.time_ns()
        return self

    def __exit__(self, *exc) -> None:
        if self._on:
            t1 = time.time_ns()
            timer = self._p.device_timer
            if timer is not None and self._device:
                item = (self._rid, self._name, self._domain, self._t0, t1, self._ev0, timer.record())
                if timer.add(item):
                    return  # written with its device times once the events completed
            self._p._emit_range(self._rid, self._name, self._domain, self._t0, t1, self._device)


class Profiler:
    """Writer of one rank's profiling records (see module doc). Thread-safe for emits."""

    def __init__(
        self,
        rank: int,
        *,
        base_dir: str | os.PathLike | None = None,
        task_id: str | None = None,
        switch_path: str | os.PathLike | None = None,
        flush_interval_s: float = 5.0,
        switch_poll_s: float = 1.0,
        max_file_bytes: int = MAX_FILE_BYTES,
        max_buffered: int = 200_000,
        device_timer: EventTimer | None = None,
    ) -> None:
        self.rank = rank
        self.device_timer = device_timer
        base = Path(base_dir or os.environ.get("FAULTMESH_PROFILING_DIR") or DEFAULT_BASE)
        tid = task_id or os.environ.get("MINDX_TASK_ID") or f"default_task_id_{int(time.time())}"
        self.rank_dir = base / tid / str(rank)
        sp = switch_path if switch_path is not None else os.environ.get("FAULTMESH_PROFILING_SWITCH")
        self.switch_path = Path(sp) if sp else None
        self.flush_interval_s = flush_interval_s
        self.switch_poll_s = switch_poll_s
        self.max_file_bytes = max_file_bytes
        self.max_buffered = max_buffered
        self.pid = os.getpid()
        self.default_on = self.switch_path is None
        self.comm_on = self.switch_path is None
        self.dropped_records = 0
        self.written_records = 0
        self.write_errors = 0
        self._ids = itertools.count(1 + (rank << 40))
        self._buf: list[bytes] = []
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()
        self._last_poll = -1e9
        self._switch_stamp: tuple[int, int] | None = None
        self._file: Path | None = None
        self.poll_switch(force=True)

    # -- switch ---------------------------------------------------------------------------------
    def poll_switch(self, force: bool = False) -> None:
        """Re-read the switch file when it changed (at most every ``switch_poll_s`` unless forced)."""
        if self.switch_path is None:
            return
        now = time.monotonic()
        if not force and now - self._last_poll < self.switch_poll_s:
            return
        self._last_poll = now
        try:
            st = self.switch_path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._switch_stamp:
                return
            data = self.switch_path.read_bytes()
            self._switch_stamp = stamp
        except OSError:
            self._switch_stamp = None
            self.default_on = self.comm_on = False
            return
        self.default_on, self.comm_on = parse_switch(data)

    # -- ranges ---------------------------------------------------------------------------------
    def step(self, n: int) -> _Range:
        """Range of training step ``n`` (marker ``step <n>``); also polls the switch and flushes."""
        self.poll_switch()
        if self.device_timer is not None:
            self.emit_device_ranges()
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()
        return _Range(self, f"step {n}", "default", True, self.default_on)

    def forward(self) -> _Range:
        """Range of the step's compute (marker ``forward``)."""
        return _Range(self, "forward", "default", True, self.default_on)

    def dataloader(self) -> _Range:
        """Range of fetching a batch (marker ``dataloader``, host only)."""
        return _Range(self, "dataloader", "default", False, self.default_on)

    def save_checkpoint(self) -> _Range:
        """Range of saving a checkpoint (marker ``save_checkpoint``, host only)."""
        return _Range(self, "save_checkpoint", "default", False, self.default_on)

    def comm(self, op_name: str, group_name: str, count: int = 0, dtype: str = "") -> _Range:
        """Range of one collective (communication domain; Name = the reference's JSON text)."""
        if not self.comm_on:
            return _Range(self, "", "communication", True, False)
        name = orjson.dumps(
            {
                "streamId": "0",
                "count": str(count),
                "dataType": dtype,
                "opName": op_name,
                "groupName": group_name,
            }
        ).decode()
        return _Range(self, name, "communication", True, True)

    def emit_device_ranges(self, wait: bool = False) -> int:
        """Write the device ranges whose CUDA events completed (``wait``: all, synchronizing); returns
        how many. :meth:`step` and :meth:`close` call it."""
        timer = self.device_timer
        if timer is None:
            return 0
        done = timer.drain(wait)
        for rid, name, domain, t0, t1, d0, d1 in done:
            self._emit_range(rid, name, domain, t0, t1, True, d0, d1)
        return len(done)

    def _emit_range(
        self,
        rid: int,
        name: str,
        domain: str,
        t0: int,
        t1: int,
        device: bool,
        d0: int | None = None,
        d1: int | None = None,
    ) -> None:
        # One bytes template per record (same JSON as orjson would write for the reference's field
        # order); Name/Domain are JSON-encoded once per range. ~4x cheaper than a dict per record.
        obj = b'"MsptiObjectId":{"Pt":{"ProcessId":%d,"ThreadId":%d},"Ds":{"DeviceId":0,"StreamId":0}},' % (
            self.pid,
            threading.get_native_id(),
        )
        first = b'"Name":' + orjson.dumps(name) + b',"Domain":' + orjson.dumps(domain) + b"}"
        rest = b'"Name":"NULL","Domain":"NULL"}'
        head = b'{"Kind":1,"Flag":%d,"SourceKind":%d,"Timestamp":%d,"Id":%d,'
        if device:
            lines = [
                head % (FLAG_DEVICE_START, SOURCE_HOST, t0, rid) + obj + first,
                head % (FLAG_DEVICE_START, SOURCE_DEVICE, t0 if d0 is None else d0, rid) + obj + rest,
                head % (FLAG_DEVICE_END, SOURCE_DEVICE, t1 if d1 is None else d1, rid) + obj + rest,
                head % (FLAG_DEVICE_END, SOURCE_HOST, t1, rid) + obj + rest,
            ]
        else:
            lines = [
                head % (FLAG_HOST_START, SOURCE_HOST, t0, rid) + obj + first,
                head % (FLAG_HOST_END, SOURCE_HOST, t1, rid) + obj + rest,
            ]
        with self._lock:
            if len(self._buf) + len(lines) > self.max_buffered:
                self.dropped_records += len(lines)
                return
            self._buf.extend(lines)

    # -- files ----------------------------------------------------------------------------------
    def _target(self) -> Path:
        if self._file is not None:
            try:
                if self._file.stat().st_size <= self.max_file_bytes:
                    return self._file
            except OSError:
                pass
        self.rank_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        names = sorted(int(p.name) for p in self.rank_dir.iterdir() if p.name.isdigit())
        if names:
            newest = self.rank_dir / str(names[-1])
            if newest.stat().st_size <= self.max_file_bytes:
                self._file = newest
                return newest
        sec = max(int(time.time()), (names[-1] + 1) if names else 0)
        self._file = self.rank_dir / str(sec)
        return self._file

    def flush(self) -> None:
        """Append buffered records to the newest data file. Never raises; failures drop and count."""
        with self._lock:
            buf, self._buf = self._buf, []
        self._last_flush = time.monotonic()
        if not buf:
            return
        try:
            path = self._target()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                data = b"\n".join(buf) + b"\n"
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            self.written_records += len(buf)
        except OSError:
            self.write_errors += 1
            self.dropped_records += len(buf)
            self._file = None

    def dump_group_info(self, groups: dict[str, tuple[str, int, list[int]]]) -> bool:
        """Write ``parallel_group.json`` (§1.5): {comm name: (group kind, group rank, global ranks)}.

        Written atomically (temp file + rename). Returns False (and counts a write error) on failure.
        """
        obj = {
            k: {"group_name": g, "group_rank": gr, "global_ranks": list(ranks)}
            for k, (g, gr, ranks) in groups.items()
        }
        try:
            self.rank_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
            tmp = self.rank_dir / f".parallel_group.json.{self.pid}"
            tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2))
            os.replace(tmp, self.rank_dir / "parallel_group.json")
            return True
        except OSError:
            self.write_errors += 1
            return False

    def close(self) -> None:
        """Write the pending device ranges (waiting for their events), then flush what is buffered."""
        self.emit_device_ranges(wait=True)
        self.flush()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Temporarily record nothing (e.g. around warm-up)."""
        saved = (self.default_on, self.comm_on, self.switch_path)
        self.default_on = self.comm_on = False
        self.switch_path = None
        try:
            yield
        finally:
            self.default_on, self.comm_on, self.switch_path = saved
            self.poll_switch(force=True)
