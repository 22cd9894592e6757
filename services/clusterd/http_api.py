"""ClusterD's read API over HTTP (issue 2): ``GET /v1/faults``, ``GET /v1/nodes``, ``GET /v1/nodes/<name>``.

``/v1/faults`` takes optional ``node``, ``level`` and ``source`` query filters and returns a JSON list of
fault objects (see :func:`clusterd.center.fault_dict`). ``/v1/nodes`` lists every node known from
faults or agents with its health (Healthy / SubHealthy / UnHealthy, clusterd.md §2.4), worst level,
fault count, connected agents and conditions; ``/v1/nodes/<name>`` adds the node's faults and
devices, or 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from clusterd.center import fault_dict
from faultmesh.httpd import json_response
from faultmesh.levels import UNHEALTHY


def node_summary(cd, name: str) -> dict[str, Any]:
    """One node's summary (health, worst level, faults, agents, conditions)."""
    health, worst = cd.center.node_health(name)
    info = cd.agents.node_info(name)
    conditions = [c for c in info.get("conditions", {}).values() if c.get("active")]
    if info.get("node_status") == UNHEALTHY:
        health = UNHEALTHY
    return {
        "name": name,
        "health": health,
        "worst_level": worst,
        "faults": len(cd.center.faults(name)),
        "agents": sorted(a for n, a in cd.agents.connected() if n == name),
        "node_ip": info.get("node_ip", ""),
        "node_status": info.get("node_status", ""),
        "conditions": conditions,
    }


def setup_routes(cd) -> None:
    """Add the fault and node routes to ``cd.http``."""

    async def faults(request: web.Request) -> web.Response:
        q = request.query
        items = cd.center.faults(q.get("node") or None)
        if "level" in q:
            items = [f for f in items if f.level == q["level"]]
        if "source" in q:
            items = [f for f in items if f.source == q["source"] or f.source.startswith(q["source"] + ":")]
        return json_response([fault_dict(f) for f in items])

    async def nodes(request: web.Request) -> web.Response:
        names = cd.center.node_names() | set(cd.agents.known) | {n for n, _ in cd.agents.connected()}
        return json_response([node_summary(cd, n) for n in sorted(names)])

    async def node(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in cd.agents.known and name not in cd.center.node_names():
            return json_response({"error": f"node {name} not known"}, status=404)
        body = node_summary(cd, name)
        body["fault_list"] = [fault_dict(f) for f in cd.center.faults(name)]
        body["devices"] = list(cd.agents.node_info(name).get("devices", {}).values())
        return json_response(body)

    cd.http.app.router.add_get("/v1/faults", faults)
    cd.http.app.router.add_get("/v1/nodes", nodes)
    cd.http.app.router.add_get("/v1/nodes/{name}", node)
