"""Slow-node detection: the watched FeatConf directory (``--slownode-watch-dir``, files
``ras-feature-slownode-<job>.json``; see :mod:`clusterd.slownode`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from clusterd.slownode.jobs import EnableError, JobState, SlowNodeStateError, unwrap_configmap
from faultmesh.files import DirWatch
from faultmesh.log import event
from fdol.slownode.featconf import FeatConf, FeatConfError, parse_featconf

log = logging.getLogger("clusterd.slownode")

WATCH_PREFIX = "ras-feature-slownode-"


class FeatConfFiles:
    """The watched directory: new/changed file -> ``enable`` (placement from the file, else
    ``resolve_placement``); removed file -> ``disable`` of the job it enabled, when that job still
    comes from a file (``jobs``: the enabled jobs, read only). A bad file is counted
    (``faultmesh_slownode_watch_files_total{result="rejected"}`` and ``reject(service, reason)``)
    and logged."""

    def __init__(
        self,
        jobs: Mapping[str, JobState],
        enable: Callable[[FeatConf, dict[int, str], str], Awaitable[Any]],
        disable: Callable[[str], Awaitable[bool]],
        resolve_placement: Callable[[FeatConf, Any], dict[int, str]],
        reject: Callable[[str, str], None],
        registry: CollectorRegistry,
    ) -> None:
        self._jobs = jobs
        self._enable = enable
        self._disable = disable
        self._resolve_placement = resolve_placement
        self._reject = reject
        self._watch: DirWatch | None = None
        self._watch_jobs: dict[str, str] = {}  # file name -> job id
        self.m_files = Counter("faultmesh_slownode_watch_files_total", "Watched FeatConf files",
                               ["result"], registry=registry)  # fmt: skip

    async def loop(self, root: Path, interval_s: float) -> None:
        """Scan ``root`` every ``interval_s`` until cancelled (a failed pass is logged)."""
        while True:
            try:
                await self.scan(root)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep watching
                event(log, logging.ERROR, "slownode watch failed", dir=str(root), error=repr(e))
            await asyncio.sleep(interval_s)

    async def scan(self, root: Path) -> None:
        """One pass over the watched directory (see the class doc)."""
        if self._watch is None or self._watch.folder != root:
            self._watch = DirWatch(root, f"{WATCH_PREFIX}*.json")
        watch = self._watch
        changed = await asyncio.to_thread(watch.changes)
        present = watch.names()
        for name in sorted(changed & present):
            try:
                data = await asyncio.to_thread((root / name).read_bytes)
                obj = orjson.loads(data)
                fc, ranks = unwrap_configmap(obj)
                job_hint = name[len(WATCH_PREFIX) : -len(".json")]
                conf = parse_featconf(fc, job_name=job_hint)
                if conf.slow_node == 0:
                    await self._enable(conf, {}, "file")
                    self._watch_jobs[name] = conf.job_id
                    self.m_files.labels("stopped").inc()
                    continue
                placement = self._resolve_placement(conf, ranks)
                await self._enable(conf, placement, "file")
                self._watch_jobs[name] = conf.job_id
                self.m_files.labels("applied").inc()
            except (OSError, orjson.JSONDecodeError, FeatConfError, EnableError, SlowNodeStateError) as e:
                self.m_files.labels("rejected").inc()
                self._reject("slownode", "bad_featconf_file")
                event(log, logging.WARNING, "slownode featconf file rejected", file=name, error=str(e))
        for name in sorted(changed - present):
            job_id = self._watch_jobs.pop(name, None)
            if job_id is not None and job_id in self._jobs and self._jobs[job_id].source == "file":
                await self._disable(job_id)
