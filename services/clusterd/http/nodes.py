"""ClusterD's read API over HTTP (issue 2): ``GET /v1/faults``, ``GET /v1/nodes``, ``GET /v1/nodes/<name>``.

``/v1/faults`` takes optional ``node``, ``level`` and ``source`` query filters and returns a JSON list of
fault objects (see :func:`clusterd.center.fault_dict`). ``/v1/nodes`` lists every node known from
faults or agents with its health (Healthy / SubHealthy / UnHealthy, clusterd.md §2.4, from
:meth:`clusterd.nodes.NodeRegistry.health`), worst level, fault count, connected agents,
conditions and ``pending_sources`` (``agent/source`` not polled yet since that agent started: its
faults are the last known, issue 20) and ``stale_agents`` (agents silent past
``--agent-stale-after-s`` or disconnected; each also an active ``AgentStale`` condition); ``/v1/nodes/<name>`` adds the node's faults and devices, or 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from clusterd.center import FaultCenter, fault_dict
from clusterd.ingest.agents import AgentHub
from clusterd.nodes import NodeRegistry
from faultmesh.httpd import json_response


class NodeApi:
    """The fault and node routes over the fault center, node registry and agent hub."""

    def __init__(self, center: FaultCenter, nodes: NodeRegistry, agents: AgentHub) -> None:
        self.center = center
        self.nodes = nodes
        self.agents = agents

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register ``/v1/faults``, ``/v1/nodes`` and ``/v1/nodes/{name}``."""
        router.add_get("/v1/faults", self.faults)
        router.add_get("/v1/nodes", self.list_nodes)
        router.add_get("/v1/nodes/{name}", self.node)

    def summary(self, name: str, agents: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """One node's summary (health, worst level, faults, agents, conditions); ``agents`` (node ->
        its connected agents, sorted) saves a pass over every stream when listing all nodes."""
        if agents is None:
            agents = _agents_by_node(self.agents.connected())
        health, worst = self.nodes.health(name)
        st = self.nodes.get(name)
        conditions = [c for c in st.conditions.values() if c.get("active")] if st else []
        stale = self.nodes.stale_conditions(name)
        return {
            "name": name,
            "health": health,
            "worst_level": worst,
            "faults": len(self.center.faults_of_node(name)),
            "agents": agents.get(name, []),
            "node_ip": st.node_ip if st else "",
            "node_status": st.node_status if st else "",
            "conditions": conditions + stale,
            "pending_sources": self.nodes.pending_sources(name),
            "stale_agents": [c["agent"] for c in stale],
        }

    async def faults(self, request: web.Request) -> web.Response:
        q = request.query
        items = self.center.faults(q.get("node") or None)
        if "level" in q:
            items = [f for f in items if f.level == q["level"]]
        if "source" in q:
            items = [f for f in items if f.source == q["source"] or f.source.startswith(q["source"] + ":")]
        return json_response([fault_dict(f) for f in items])

    async def list_nodes(self, request: web.Request) -> web.Response:
        connected = self.agents.connected()
        agents = _agents_by_node(connected)  # once per request: O(nodes), not O(nodes x streams)
        names = self.nodes.all_names() | agents.keys()
        return json_response([self.summary(n, agents) for n in sorted(names)])

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.nodes and name not in self.center.node_names():
            return json_response({"error": f"node {name} not known"}, status=404)
        body = self.summary(name)
        body["fault_list"] = [fault_dict(f) for f in self.center.faults(name)]
        st = self.nodes.get(name)
        body["devices"] = list(st.devices.values()) if st else []
        return json_response(body)


def _agents_by_node(connected: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(node, agent) pairs (sorted) -> node -> its agents, in that order."""
    out: dict[str, list[str]] = {}
    for node, agent in connected:
        out.setdefault(node, []).append(agent)
    return out
