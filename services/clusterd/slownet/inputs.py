"""Slow-network detection: the file inputs (``--slownet-config``, ``--slownet-topology``, the result
CSVs under ``--slownet-csv-root``), polled with the core's change detectors (see
:mod:`clusterd.slownet`). :class:`InputFiles` reads what changed (blocking, in a worker thread);
:class:`clusterd.slownet.component.SlowNetComponent` applies it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from faultmesh.files import FileWatch, Stamp, stamp
from fdol.slownet.csvfile import PingRecord, read_csv_rows

if TYPE_CHECKING:
    from clusterd.slownet.state import SlowNetConfig


class InputFiles:
    """The change detectors of the input files named by ``cfg`` (``--slownet-config``,
    ``--slownet-topology``, ``--slownet-csv-root``). Its scans block: run them in a worker thread,
    one at a time."""

    def __init__(self, cfg: SlowNetConfig) -> None:
        self.cfg = cfg
        self._watches: dict[str, FileWatch] = {}  # input file -> its change detector
        self._csv_stamp: dict[str, Stamp] = {}  # CSV file -> (mtime_ns, size) last read
        self._csv_newest: dict[str, int] = {}  # ping_result_<idx> series -> newest row ts taken (ms)

    def _file_changed(self, path: Path) -> bool:
        """True when ``path`` exists and its content changed since the last look (core FileWatch)."""
        w = self._watches.get(str(path))
        if w is None:
            w = self._watches[str(path)] = FileWatch(path)
        return w.changed() and path.exists()

    def scan_files(self) -> tuple[tuple[str, str | OSError] | None, list[tuple[str, str | OSError]]]:
        """Blocking: read the input files that changed -> (config (path, text|error), [(path, text|error)])."""

        def read(p: Path) -> str | OSError:
            try:
                return p.read_text(encoding="utf-8")
            except OSError as e:
                return e

        a = self.cfg
        cfg = None
        if a.slownet_config and self._file_changed(Path(a.slownet_config)):
            cfg = (a.slownet_config, read(Path(a.slownet_config)))
        topos = []
        if a.slownet_topology:
            p = Path(a.slownet_topology)
            if p.is_dir():
                files = sorted(p.glob("super-pod-*.json")) + sorted(p.glob("super-pod-*/super-pod-*.json"))
            else:
                files = [p]
            topos = [(str(f), read(f)) for f in files if self._file_changed(f)]
        return cfg, topos

    def scan_csv(self, spids: list[str]) -> dict[str, tuple[list[PingRecord], int]]:
        """Blocking: new rows of the changed result CSVs per super pod -> {spid: (rows, bad lines)}.
        Per ``ping_result_<idx>`` (its .csv and .csv-bak), rows not newer than the newest row already
        taken are skipped, so a rollover or a re-read never counts a row twice."""
        out: dict[str, tuple[list[PingRecord], int]] = {}
        root = Path(self.cfg.slownet_csv_root) / "cluster"
        for spid in spids:
            d = root / f"super-pod-{spid}"
            rows_all: list[PingRecord] = []
            bad_all = 0
            for f in sorted(d.glob("ping_result_*.csv-bak")) + sorted(d.glob("ping_result_*.csv")):
                st = stamp(f)
                if st is None or self._csv_stamp.get(str(f)) == st:
                    continue
                self._csv_stamp[str(f)] = st
                series = str(d / f.name.split(".")[0])
                newest = self._csv_newest.get(series, 0)
                rows, bad = read_csv_rows(f)
                fresh = [r for r in rows if r.timestamp_ms > newest]
                if fresh:
                    self._csv_newest[series] = max(r.timestamp_ms for r in fresh)
                rows_all += fresh
                bad_all += bad
            out[spid] = (rows_all, bad_all)
        return out
