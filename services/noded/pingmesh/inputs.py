"""noded pingmesh: the input files (``--pingmesh-config-file``, ``--pingmesh-topology-file``, the ping
list file; see :mod:`noded.pingmesh.component`), polled with the core's change detectors.
:class:`InputFiles` reads what changed (blocking, in the bounded pool); the source parses and
applies it."""

from __future__ import annotations

import os
from pathlib import Path

from faultmesh.files import FileWatch, stamp
from noded.sections import PingmeshConfig

MAX_FILE_BYTES = 64 << 20


class InputFiles:
    """The change detectors of the input files named by ``cfg`` (the pingmesh section). Its
    scans block: run them in the bounded pool, one at a time."""

    def __init__(self, cfg: PingmeshConfig) -> None:
        self.cfg = cfg
        self._watches: dict[str, FileWatch] = {}

    def _changed(self, path: str | None) -> bool:
        if not path:
            return False
        watch = self._watches.setdefault(path, FileWatch(path))
        return watch.changed() and stamp(path) is not None  # a removed file keeps the last input

    def ping_list_path(self, super_pod_id: str | None, server_index: int | None) -> str | None:
        """``--pingmesh-ping-list-file``, else ``<net-root>/cluster/super-pod-<id>/
        ping_list_<serverIndex>.json`` once the super pod and server index are known."""
        if self.cfg.pingmesh_ping_list_file:
            return self.cfg.pingmesh_ping_list_file
        if super_pod_id is None or server_index is None:
            return None
        root = Path(self.cfg.pingmesh_net_root or self.cfg.pingmesh_dir)
        return str(root / "cluster" / f"super-pod-{super_pod_id}" / f"ping_list_{server_index}.json")

    def scan(
        self, super_pod_id: str | None, server_index: int | None
    ) -> list[tuple[str, str, bytes | Exception]]:
        """Blocking: [(kind, path, content or error)] for the input files that changed (kind
        ``config``, ``topology``, ``ping_list``; a file over 64 MiB is an error)."""
        a = self.cfg
        out: list[tuple[str, str, bytes | Exception]] = []
        for path, kind in (
            (a.pingmesh_config_file, "config"),
            (a.pingmesh_topology_file, "topology"),
            (self.ping_list_path(super_pod_id, server_index), "ping_list"),
        ):
            if not self._changed(path):
                continue
            try:
                if os.path.getsize(path) > MAX_FILE_BYTES:
                    raise ValueError("file larger than 64 MiB")
                out.append((kind, path, Path(path).read_bytes()))
            except (OSError, ValueError) as e:
                out.append((kind, path, e))
        return out
