"""pingmesh result files and rows: ``<nodename>.log``, ``ping_result_<serverIndex>.csv``, PingResult.

Source: reference noded.md §6 "Result file" and fdol.md §8.4:

- ``<dir>/<nodename>.log``: per collection round the lines ``uid: <job uid>, config: <Go %#v>``,
  ``physicID: <id>, taskID: <t>, DestNum: <n>`` per chip task, and one compact JSON object per
  destination (``source_addr`` = the source SDID as the pseudo IP, ``target_addr``, ``suc_pkt_num``,
  ``fail_pkt_num``, ``max_time``, ``min_time``, ``avg_time``, ``tp95_time``, ``reply_stat_num``,
  ``ping_total_num``). Each line is ``[YYYY-MM-DD HH:MM:SS.ffffff] [INFO]     <id>       <file>:<line>    <msg>``,
  cut at 2047 characters. Rotation at ``max_bytes`` (20 MiB) to ``<nodename>-<YYYYmmddHHMMSS>.log``,
  at most ``max_backups`` kept, backups older than ``max_age_days`` removed.
- ``<net_root>/cluster/super-pod-<spid>/ping_result_<serverIndex>.csv`` (mode 0644) with the header
  below; loss = fail / (suc + fail) with 3 decimals in all three loss columns; timestamp = write time
  (ms). When the current file was started 45 s ago or more, it is renamed to ``.csv-bak`` (replacing
  the previous one) and a fresh file with the header is started; otherwise rows are appended.
  ``.csv-bak`` files older than ``max_age_days`` are removed too.

Destinations that answered no packet in the sample (suc + fail == 0) give no row (unknown, not lost).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from faultmesh._pb import agent_pb2
from faultmesh.dcmi.hccsping import HccspingInfo
from fdol.slownet.csvfile import CSV_HEADER, read_csv_rows
from fdol.slownet.topology import sdid_to_ip
from noded.pingmesh.wire import csv_line

__all__ = ["CSV_HEADER", "ResultWriter", "TaskSample", "csv_line", "read_csv_rows", "rows_from_samples"]

CSV_ROLLOVER_S = 45.0
MAX_LINE = 2047
LOG_MAX_BYTES = 20 << 20
LOG_MAX_BACKUPS = 180


@dataclass(frozen=True)
class TaskSample:
    """One chip task's sample: source phy id / SDID, task id, decoded info."""

    phy_id: int
    sdid: int
    task_id: int
    info: HccspingInfo


def rows_from_samples(
    samples: list[TaskSample], allowed: dict[int, set[str]], super_pod_id: str, now_ms: int
) -> tuple[list[agent_pb2.PingResult], int]:
    """PingResult rows (CSV columns) for every destination that is in the ping list of its source
    (``allowed``: phy -> destination addresses) and answered at least one packet in the sample.
    Returns (rows, skipped destinations not in the ping list)."""
    rows = []
    skipped = 0
    for s in samples:
        ok = allowed.get(s.phy_id, set())
        for d in s.info.dests:
            if d.addr not in ok:
                skipped += 1
                continue
            total = d.suc + d.fail
            if total <= 0:
                continue
            loss = round(d.fail / total, 3)
            rows.append(
                agent_pb2.PingResult(
                    ping_task_id=s.task_id,
                    src_type="0",
                    src_addr=str(s.sdid),
                    dst_type="0",
                    dst_addr=d.addr,
                    min_delay=float(d.min_time),
                    max_delay=float(d.max_time),
                    avg_delay=float(d.avg_time),
                    min_loss_rate=loss,
                    max_loss_rate=loss,
                    avg_loss_rate=loss,
                    timestamp_ms=now_ms,
                    super_pod_id=super_pod_id,
                    src_phy_id=s.phy_id,
                )
            )
    return rows, skipped


class ResultWriter:
    """Writes the log and the CSV (blocking file I/O: call it from a worker thread).

    ``log_dir`` holds ``<node>.log``; ``net_root`` holds ``cluster/super-pod-<spid>/``. Times: ``clock``
    returns seconds (wall clock); ``max_age_days`` > 0 enables age retention.
    """

    def __init__(
        self,
        node: str,
        log_dir: str | os.PathLike,
        net_root: str | os.PathLike | None,
        max_age_days: float = 7.0,
        max_bytes: int = LOG_MAX_BYTES,
        max_backups: int = LOG_MAX_BACKUPS,
        rollover_s: float = CSV_ROLLOVER_S,
        clock=time.time,
    ) -> None:
        self.node = node
        self.log_dir = Path(log_dir)
        self.net_root = Path(net_root) if net_root else None
        self.max_age_s = max_age_days * 86400
        self.max_bytes = max_bytes
        self.max_backups = max_backups
        self.rollover_s = rollover_s
        self.clock = clock
        self._csv_started: dict[Path, float] = {}

    @property
    def log_path(self) -> Path:
        """``<log_dir>/<node>.log``."""
        return self.log_dir / f"{self.node}.log"

    def csv_path(self, super_pod_id: str, server_index: int) -> Path | None:
        """``<net_root>/cluster/super-pod-<spid>/ping_result_<idx>.csv`` (None without net_root)."""
        if self.net_root is None:
            return None
        return self.net_root / "cluster" / f"super-pod-{super_pod_id}" / f"ping_result_{server_index}.csv"

    def _line(self, msg: str) -> str:
        ts = datetime.fromtimestamp(self.clock()).strftime("%Y-%m-%d %H:%M:%S.%f")
        line = f"[{ts}] {'[INFO]':<11}{os.getpid() % 100000:<8}pingmesh/results.py:0    {msg}"
        return line[:MAX_LINE]

    def write_round(
        self, uid: str, config_repr: str, samples: list[TaskSample], allowed: dict[int, set[str]]
    ) -> None:
        """Append one collection round to ``<node>.log`` (module doc); rotates first when needed.
        Only destinations in the source's ping list are written."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._rotate_log()
        lines = [self._line(f"uid: {uid}, config: {config_repr}")]
        for s in samples:
            lines.append(self._line(f"physicID: {s.phy_id}, taskID: {s.task_id}, DestNum: {s.info.dest_num}"))
            src_ip = sdid_to_ip(s.sdid)
            ok = allowed.get(s.phy_id, set())
            for d in s.info.dests:
                if d.addr not in ok:
                    continue
                obj = {
                    "source_addr": src_ip,
                    "target_addr": d.addr,
                    "suc_pkt_num": d.suc,
                    "fail_pkt_num": d.fail,
                    "max_time": d.max_time,
                    "min_time": d.min_time,
                    "avg_time": d.avg_time,
                    "tp95_time": d.tp95_time,
                    "reply_stat_num": d.reply_stat_num,
                    "ping_total_num": d.ping_total_num,
                }
                lines.append(self._line(json.dumps(obj, separators=(",", ":"))))
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    def _rotate_log(self) -> None:
        p = self.log_path
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            size = 0
        if size >= self.max_bytes:
            stamp = datetime.fromtimestamp(self.clock()).strftime("%Y%m%d%H%M%S%f")
            os.replace(p, self.log_dir / f"{self.node}-{stamp}.log")
        backups = sorted(self.log_dir.glob(f"{self.node}-*.log"))
        now = self.clock()
        for i, b in enumerate(backups):
            try:
                old = self.max_age_s > 0 and now - b.stat().st_mtime > self.max_age_s
            except FileNotFoundError:
                continue
            if old or i < len(backups) - self.max_backups:
                b.unlink(missing_ok=True)

    def write_csv(
        self, super_pod_id: str, server_index: int, rows: list[agent_pb2.PingResult], roce: bool = False
    ) -> Path | None:
        """Append rows to the CSV, rolling it over to ``.csv-bak`` after ``rollover_s`` (module doc).
        ``roce``: the RoCE plane's file ``cluster/super-pod-roce/ping_result_<spid>_<idx>.csv`` (the
        reference's roceping). Returns the CSV path (None without net_root)."""
        path = self.csv_path(super_pod_id, server_index)
        if roce and path is not None:
            path = (
                self.net_root
                / "cluster"
                / "super-pod-roce"
                / f"ping_result_{super_pod_id}_{server_index}.csv"
            )
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        now = self.clock()
        started = self._csv_started.get(path)
        if started is None and path.exists():
            started = path.stat().st_mtime  # a file from before a restart counts from its last write
        bak = path.with_suffix(".csv-bak")
        fresh = started is None or now - started >= self.rollover_s or not path.exists()
        if fresh and path.exists():
            os.replace(path, bak)
        if self.max_age_s > 0 and bak.exists() and now - bak.stat().st_mtime > self.max_age_s:
            bak.unlink(missing_ok=True)
        mode = "w" if fresh else "a"
        with open(path, mode, encoding="utf-8") as f:
            if fresh:
                f.write(CSV_HEADER + "\n")
                self._csv_started[path] = now
            for r in rows:
                f.write(csv_line(r) + "\n")
        os.chmod(path, 0o644)
        return path
