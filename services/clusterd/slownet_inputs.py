"""Slow-network detection: the file inputs (``--slownet-config``, ``--slownet-topology``, the result
CSVs under ``--slownet-csv-root``), polled with the core's change detectors (see
:mod:`clusterd.slownet`); a mixin of :class:`clusterd.slownet.SlowNetComponent`."""

from __future__ import annotations

import logging
from pathlib import Path

from faultmesh.config import load_document
from faultmesh.files import FileWatch, stamp
from faultmesh.log import event
from fdol.slownet import config as pmconfig
from fdol.slownet import topology as topo
from fdol.slownet.csvfile import PingRecord, read_csv_rows

log = logging.getLogger("clusterd.slownet")


class SlowNetInputs:
    """Polls the input files of the component (``args``, ``set_config``, ``set_topology``, ``pods``)."""

    def _file_changed(self, path: Path) -> bool:
        """True when ``path`` exists and its content changed since the last look (core FileWatch)."""
        w = self._watches.get(str(path))
        if w is None:
            w = self._watches[str(path)] = FileWatch(path)
        return w.changed() and path.exists()

    def _scan_files(self) -> tuple[tuple[str, str | OSError] | None, list[tuple[str, str | OSError]]]:
        """Blocking: read the input files that changed -> (config (path, text|error), [(path, text|error)])."""

        def read(p: Path) -> str | OSError:
            try:
                return p.read_text(encoding="utf-8")
            except OSError as e:
                return e

        a = self.args
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

    async def _poll_files(self) -> None:
        cfg, topos = await self._in_thread("files", self._scan_files)
        if cfg is not None:
            path, text = cfg
            try:
                if isinstance(text, OSError):
                    raise text
                await self.set_config(pmconfig.parse_config(load_document(text)), f"file:{path}")
            except (OSError, ValueError) as e:
                self.m_inputs.labels("config").inc()
                event(log, logging.WARNING, "slownet input rejected", kind="config", file=path, error=str(e))
        for path, text in topos:
            try:
                if isinstance(text, OSError):
                    raise text
                await self.set_topology(topo.parse_super_pod(text), f"file:{path}")
            except (OSError, ValueError) as e:
                self.m_inputs.labels("topology").inc()
                event(
                    log, logging.WARNING, "slownet input rejected", kind="topology", file=path, error=str(e)
                )

    def _scan_csv(self, spids: list[str]) -> dict[str, tuple[list[PingRecord], int]]:
        """Blocking: new rows of the changed result CSVs per super pod -> {spid: (rows, bad lines)}.
        Per ``ping_result_<idx>`` (its .csv and .csv-bak), rows not newer than the newest row already
        taken are skipped, so a rollover or a re-read never counts a row twice."""
        out: dict[str, tuple[list[PingRecord], int]] = {}
        root = Path(self.args.slownet_csv_root) / "cluster"
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
