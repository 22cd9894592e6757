"""Slow-node detection: the HTTP routes ``/v1/slownode...`` (see :mod:`clusterd.slownode`). The
POSTs' bearer token is checked by :mod:`clusterd.auth`'s middleware."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from clusterd.slownode.jobs import EnableError, JobState, SlowNodeStateError, job_status, unwrap_configmap
from faultmesh.httpd import json_response
from fdol.slownode.featconf import FeatConf, FeatConfError, parse_featconf


class SlowNodeHttp:
    """The ``/v1/slownode`` routes over the enabled ``jobs`` (read only; ``find(job)``: by id or
    name). ``enable(conf, placement, source)`` / ``disable(job)`` change them (:class:`EnableError`:
    400, :class:`SlowNodeStateError`: 503, nothing changed); ``resolve_placement(conf, ranks)``
    gives the placement of a body without ``ranks``; ``reject(service, reason)`` counts a refused
    body."""

    def __init__(
        self,
        jobs: Mapping[str, JobState],
        find: Callable[[str], JobState | None],
        enable: Callable[[FeatConf, dict[int, str], str], Awaitable[JobState]],
        disable: Callable[[str], Awaitable[bool]],
        resolve_placement: Callable[[FeatConf, Any], dict[int, str]],
        reject: Callable[[str, str], None],
    ) -> None:
        self._jobs = jobs
        self._find = find
        self._enable = enable
        self._disable = disable
        self._resolve_placement = resolve_placement
        self._reject = reject

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """GET /v1/slownode, POST /v1/slownode/jobs, GET /v1/slownode/{job}, POST
        /v1/slownode/{job}/disable, DELETE /v1/slownode/{job}."""
        router.add_get("/v1/slownode", self._http_list)
        router.add_post("/v1/slownode/jobs", self._http_enable)
        router.add_get("/v1/slownode/{job}", self._http_get)
        router.add_post("/v1/slownode/{job}/disable", self._http_disable)
        router.add_delete("/v1/slownode/{job}", self._http_disable)

    async def _http_enable(self, request: web.Request) -> web.Response:
        try:
            obj = orjson.loads(await request.read())
            fc, ranks = unwrap_configmap(obj)
            conf = parse_featconf(fc)
            placement = {} if conf.slow_node == 0 else self._resolve_placement(conf, ranks)
            js = await self._enable(conf, placement, "http")
        except (orjson.JSONDecodeError, FeatConfError, EnableError) as e:
            self._reject("slownode", "bad_enable")
            return json_response({"error": str(e)}, 400)
        except SlowNodeStateError as e:  # nothing changed; the client may retry
            return json_response({"error": str(e)}, 503)
        if conf.slow_node == 0:
            return json_response({"jobId": conf.job_id, "enabled": False})
        return json_response(job_status(js))

    async def _http_disable(self, request: web.Request) -> web.Response:
        job = request.match_info["job"]
        try:
            found = await self._disable(job)
        except SlowNodeStateError as e:
            return json_response({"error": str(e)}, 503)
        if not found:
            return json_response({"error": f"job {job!r} has no slow-node detection enabled"}, 404)
        return json_response({"jobId": job, "enabled": False})

    async def _http_list(self, request: web.Request) -> web.Response:
        return json_response([job_status(js, brief=True) for _, js in sorted(self._jobs.items())])

    async def _http_get(self, request: web.Request) -> web.Response:
        js = self._find(request.match_info["job"])
        if js is None:
            job = request.match_info["job"]
            return json_response({"error": f"job {job!r} has no slow-node detection enabled"}, 404)
        return json_response(job_status(js))
