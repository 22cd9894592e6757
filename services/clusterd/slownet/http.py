"""Slow-network detection: the HTTP routes (``/v1/pingmesh...``, see :mod:`clusterd.slownet`) over the
component's :class:`~clusterd.slownet.state.SlowNetState`. The POSTs' bearer token is checked by
:mod:`clusterd.auth`'s middleware."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from clusterd.slownet.state import AGENT, SlowNetState
from faultmesh.config import MAX_YAML_BYTES, load_document, parse_untrusted
from faultmesh.httpd import json_response
from fdol.slownet import config as pmconfig
from fdol.slownet import topology as topo


class SlowNetHttp:
    """The ``/v1/pingmesh`` routes: reads ``state``; ``connected()`` lists the connected (node,
    agent) pairs; ``set_topology(sp, origin)`` / ``set_config(cfg, origin)`` apply a posted input
    (``ValueError``: refused, counted in ``rejected{kind}``)."""

    def __init__(
        self,
        state: SlowNetState,
        connected: Callable[[], Iterable[tuple[str, str]]],
        set_topology: Callable[[topo.SuperPod, str], Awaitable[None]],
        set_config: Callable[[dict[str, pmconfig.Activation], str], Awaitable[None]],
        rejected: Counter,
    ) -> None:
        self.state = state
        self._connected = connected
        self.set_topology = set_topology
        self.set_config = set_config
        self.m_inputs = rejected

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """GET /v1/pingmesh, GET /v1/pingmesh/{spid}, POST /v1/pingmesh/topology and /config."""
        router.add_get("/v1/pingmesh", self._http_all)
        router.add_get("/v1/pingmesh/{spid}", self._http_one)
        router.add_post("/v1/pingmesh/topology", self._http_topology)
        router.add_post("/v1/pingmesh/config", self._http_config)

    def pod_status(self, spid: str) -> dict[str, Any]:
        """One super pod's status (latest summary, alarms, config, timing)."""
        pod = self.state.pods[spid]
        act = self.state.activation(spid)
        connected = {n for n, a in self._connected() if a == AGENT}
        return {
            **pod.status,
            "activate": bool(act and act.activate),
            "taskInterval": act.task_interval if act else None,
            "periodMs": pod.analyzer.params.period_ms,
            "lastAnalyzedPeriod": pod.last_period,
            "lastAnalysisMs": pod.last_analysis_ms,
            "analysisSeconds": round(pod.analysis_s, 4),
            "paths": len(pod.pairs),
            "nodesConnected": sorted(set(pod.sp.nodes) & connected),
        }

    async def _http_all(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "config": pmconfig.to_json_obj(self.state.config),
                "superPods": [self.pod_status(s) for s in sorted(self.state.pods)],
            }
        )

    async def _http_one(self, request: web.Request) -> web.Response:
        spid = request.match_info["spid"]
        if spid not in self.state.pods:
            return json_response({"error": f"super pod {spid} not known"}, status=404)
        return json_response(self.pod_status(spid))

    async def _http_topology(self, request: web.Request) -> web.Response:
        try:
            sp = topo.parse_super_pod(await request.read())
            await self.set_topology(sp, "http")
        except ValueError as e:
            self.m_inputs.labels("topology").inc()
            return json_response({"error": str(e)}, status=400)
        return json_response(
            {
                "superPodId": sp.super_pod_id,
                "nodes": len(sp.nodes),
                "paths": len(self.state.pods[sp.super_pod_id].pairs),
            }
        )

    async def _http_config(self, request: web.Request) -> web.Response:
        try:
            raw = await request.read()
            cfg = pmconfig.parse_config(await parse_untrusted(load_document, raw, MAX_YAML_BYTES))
            await self.set_config(cfg, "http")
        except ValueError as e:
            self.m_inputs.labels("config").inc()
            return json_response({"error": str(e)}, status=400)
        return json_response({"config": pmconfig.to_json_obj(cfg)})
