"""Slow-node detection: the watched FeatConf directory and the HTTP routes (see
:mod:`clusterd.slownode`); a mixin of :class:`clusterd.slownode.SlowNodeComponent`."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from clusterd.slownode_jobs import EnableError, JobState, SlowNodeStateError, unwrap_configmap
from faultmesh.files import DirWatch
from faultmesh.httpd import json_response
from faultmesh.log import event
from fdol.slownode.featconf import FeatConfError, parse_featconf

log = logging.getLogger("clusterd.slownode")

WATCH_PREFIX = "ras-feature-slownode-"


class SlowNodeHttp:
    """Watched directory and HTTP handlers over the component's ``jobs``, ``enable``, ``disable``."""

    # -- watched directory ------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        root = Path(self.ctx.config.slownode_watch_dir)
        while True:
            try:
                await self.scan_watch_dir(root)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep watching
                event(log, logging.ERROR, "slownode watch failed", dir=str(root), error=repr(e))
            await asyncio.sleep(self.ctx.config.slownode_watch_interval)

    async def scan_watch_dir(self, root: Path) -> None:
        """One pass over the watched directory (see module doc)."""
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
                    await self.enable(conf, {}, "file")
                    self._watch_jobs[name] = conf.job_id
                    self.m_files.labels("stopped").inc()
                    continue
                placement = self.resolve_placement(conf, ranks)
                await self.enable(conf, placement, "file")
                self._watch_jobs[name] = conf.job_id
                self.m_files.labels("applied").inc()
            except (OSError, orjson.JSONDecodeError, FeatConfError, EnableError, SlowNodeStateError) as e:
                self.m_files.labels("rejected").inc()
                self.ctx.metrics.reject("slownode", "bad_featconf_file")
                event(log, logging.WARNING, "slownode featconf file rejected", file=name, error=str(e))
        for name in sorted(changed - present):
            job_id = self._watch_jobs.pop(name, None)
            if job_id is not None and job_id in self.jobs and self.jobs[job_id].source == "file":
                await self.disable(job_id)

    # -- HTTP -------------------------------------------------------------------------------------
    async def _http_enable(self, request: web.Request) -> web.Response:
        try:
            obj = orjson.loads(await request.read())
            fc, ranks = unwrap_configmap(obj)
            conf = parse_featconf(fc)
            placement = {} if conf.slow_node == 0 else self.resolve_placement(conf, ranks)
            js = await self.enable(conf, placement, "http")
        except (orjson.JSONDecodeError, FeatConfError, EnableError) as e:
            self.ctx.metrics.reject("slownode", "bad_enable")
            return json_response({"error": str(e)}, 400)
        except SlowNodeStateError as e:  # nothing changed; the client may retry
            return json_response({"error": str(e)}, 503)
        if conf.slow_node == 0:
            return json_response({"jobId": conf.job_id, "enabled": False})
        return json_response(self.status(js))

    async def _http_disable(self, request: web.Request) -> web.Response:
        job = request.match_info["job"]
        try:
            found = await self.disable(job)
        except SlowNodeStateError as e:
            return json_response({"error": str(e)}, 503)
        if not found:
            return json_response({"error": f"job {job!r} has no slow-node detection enabled"}, 404)
        return json_response({"jobId": job, "enabled": False})

    async def _http_list(self, request: web.Request) -> web.Response:
        return json_response([self.status(js, brief=True) for _, js in sorted(self.jobs.items())])

    async def _http_get(self, request: web.Request) -> web.Response:
        js = self._find(request.match_info["job"])
        if js is None:
            job = request.match_info["job"]
            return json_response({"error": f"job {job!r} has no slow-node detection enabled"}, 404)
        return json_response(self.status(js))

    def status(self, js: JobState, brief: bool = False) -> dict[str, Any]:
        """The job's status document (``GET /v1/slownode/<job>``)."""
        t = js.tracker
        d: dict[str, Any] = {
            "jobId": js.conf.job_id,
            "jobName": js.conf.job_name,
            "namespace": js.conf.job_namespace,
            "enabled": True,
            "source": js.source,
            "nodes": js.nodes(),
            "heavyProfiling": t.heavy,
            "heavyReason": t.heavy_reason,
            "degraded": t.degraded,
            "slowRanks": t.reported_ranks,
            "consecutiveSlowRounds": t.slow_rounds,
            "rounds": js.detector.rounds,
            "enabledMs": js.enabled_ms,
        }
        if brief:
            return d
        d["featConf"] = js.conf.to_json()
        d["ranks"] = {str(r): n for r, n in sorted(js.placement.items())}
        d["cluster"] = js.latest
        d["nodeResults"] = js.detector.reports
        d["history"] = list(js.rounds)
        return d
