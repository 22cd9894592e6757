"""Slow-network detection: the HTTP routes (``/v1/pingmesh...``, see :mod:`clusterd.slownet`);
a mixin of :class:`clusterd.slownet.SlowNetComponent`. The POSTs' bearer token is checked by
:mod:`clusterd.auth`'s middleware."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from faultmesh.config import MAX_YAML_BYTES, load_document, parse_untrusted
from faultmesh.httpd import json_response
from fdol.slownet import config as pmconfig
from fdol.slownet import topology as topo

AGENT = "noded"


class SlowNetHttp:
    """HTTP handlers over the component's pods, config and inputs."""

    # -- HTTP -------------------------------------------------------------------------------------
    def pod_status(self, spid: str) -> dict[str, Any]:
        """One super pod's status (latest summary, alarms, config, timing)."""
        pod = self.pods[spid]
        act = self.activation(spid)
        connected = {n for n, a in self.ctx.agents.connected() if a == AGENT}
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
                "config": pmconfig.to_json_obj(self.config),
                "superPods": [self.pod_status(s) for s in sorted(self.pods)],
            }
        )

    async def _http_one(self, request: web.Request) -> web.Response:
        spid = request.match_info["spid"]
        if spid not in self.pods:
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
                "paths": len(self.pods[sp.super_pod_id].pairs),
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
