"""The pingmesh result CSV ``ping_result_<serverIndex>.csv``: header, line format, tolerant reader.

Source: reference noded.md §6 and fdol.md §8.4 (header below; loss columns with 3 decimals; delays
-1 when the ping failed; timestamp = write time in ms; doc example row
``0,0,6094863,0,4194304,-1,-1,-1,1.000,1.000,1.000,1755687818727``). noded writes it
(:mod:`noded.pingmesh.results`); clusterd may read it from shared storage (``--slownet-csv-root``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the window imports numpy: noded writes these files without FD-OL (issue 18)
    from fdol.slownet.window import PingRow

CSV_HEADER = "pingTaskId,srcType,srcAddr,dstType,dstAddr,minDelay,maxDelay,avgDelay,minLossRate,maxLossRate,avgLossRate,timestamp"


@dataclass(frozen=True, slots=True)
class PingRecord:
    """One result row with every CSV column (header order). Loss rates are fractions 0..1; delays in
    the driver's unit, -1 when the ping failed; ``timestamp_ms`` = write time, ms since the epoch."""

    ping_task_id: int
    src_type: str
    src_addr: str
    dst_type: str
    dst_addr: str
    min_delay: float
    max_delay: float
    avg_delay: float
    min_loss_rate: float
    max_loss_rate: float
    avg_loss_rate: float
    timestamp_ms: int

    def row(self) -> PingRow:
        """The analysis row (:class:`fdol.slownet.window.PingRow`; loss = ``avg_loss_rate``)."""
        from fdol.slownet.window import PingRow

        return PingRow(
            self.ping_task_id, self.src_type, self.src_addr, self.dst_type, self.dst_addr,
            self.min_delay, self.max_delay, self.avg_delay, self.avg_loss_rate, self.timestamp_ms,
        )  # fmt: skip


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def csv_line(r: PingRecord) -> str:
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


def read_csv_rows(path: str | os.PathLike) -> tuple[list[PingRecord], int]:
    """Parse a ping_result CSV (or .csv-bak). Returns (rows, skipped lines): a missing header, a
    line cut mid-way, or a non-numeric field is skipped and counted."""
    rows: list[PingRecord] = []
    bad = 0
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
                PingRecord(
                    int(parts[0]),
                    parts[1],
                    parts[2],
                    parts[3],
                    parts[4],
                    float(parts[5]),
                    float(parts[6]),
                    float(parts[7]),
                    float(parts[8]),
                    float(parts[9]),
                    float(parts[10]),
                    int(parts[11]),
                )  # fmt: skip
            )
        except ValueError:
            bad += 1
    return rows, bad
