"""The pingmesh result CSV ``ping_result_<serverIndex>.csv``: header, line format, tolerant reader.

Source: reference noded.md §6 and fdol.md §8.4 (header below; loss columns with 3 decimals; delays
-1 when the ping failed; timestamp = write time in ms; doc example row
``0,0,6094863,0,4194304,-1,-1,-1,1.000,1.000,1.000,1755687818727``). noded writes it
(:mod:`noded.pingmesh.results`); clusterd may read it from shared storage (``--slownet-csv-root``).
"""

from __future__ import annotations

import os
from pathlib import Path

from faultmesh._pb import agent_pb2

CSV_HEADER = "pingTaskId,srcType,srcAddr,dstType,dstAddr,minDelay,maxDelay,avgDelay,minLossRate,maxLossRate,avgLossRate,timestamp"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def csv_line(r: agent_pb2.PingResult) -> str:
    """One CSV line (no newline) for a row, in the header's column order."""
    return ",".join(
        [
            str(r.ping_task_id),
            r.src_type,
            r.src_addr,
            r.dst_type,
            r.dst_addr,
            _num(r.min_delay),
            _num(r.max_delay),
            _num(r.avg_delay),
            f"{r.min_loss_rate:.3f}",
            f"{r.max_loss_rate:.3f}",
            f"{r.avg_loss_rate:.3f}",
            str(r.timestamp_ms),
        ]
    )


def read_csv_rows(path: str | os.PathLike) -> tuple[list[agent_pb2.PingResult], int]:
    """Parse a ping_result CSV (or .csv-bak). Returns (rows, skipped lines): a missing header, a
    line cut mid-way, or a non-numeric field is skipped and counted."""
    rows, bad = [], 0
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], 0
    lines = text.split("\n")
    complete = lines[:-1] if not text.endswith("\n") else lines
    if not text.endswith("\n") and lines[-1]:
        bad += 1  # the last line was cut mid-write
    for i, line in enumerate(complete):
        if not line:
            continue
        if i == 0 and line == CSV_HEADER:
            continue
        parts = line.split(",")
        if len(parts) != 12:
            bad += 1
            continue
        try:
            rows.append(
                agent_pb2.PingResult(
                    ping_task_id=int(parts[0]),
                    src_type=parts[1],
                    src_addr=parts[2],
                    dst_type=parts[3],
                    dst_addr=parts[4],
                    min_delay=float(parts[5]),
                    max_delay=float(parts[6]),
                    avg_delay=float(parts[7]),
                    min_loss_rate=float(parts[8]),
                    max_loss_rate=float(parts[9]),
                    avg_loss_rate=float(parts[10]),
                    timestamp_ms=int(parts[11]),
                )
            )
        except ValueError:
            bad += 1
    return rows, bad
