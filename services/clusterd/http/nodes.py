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

import orjson
from aiohttp import web

from clusterd.center import FaultCenter, fault_dict
from clusterd.ingest.agents import AgentHub
from clusterd.nodehealth import SortedNames, with_status
from clusterd.nodes import NodeRegistry
from faultmesh.httpd import json_response

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS  # as json_response writes


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


class NodeApi:
    """The fault and node routes over the fault center, node registry and agent hub."""

    def __init__(self, center: FaultCenter, nodes: NodeRegistry, agents: AgentHub) -> None:
        self.center = center
        self.nodes = nodes
        self.agents = agents
        self._json: dict[str, tuple[tuple, bytes]] = {}  # node -> (its plain fields, its JSON)
        self._sorted = SortedNames()

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register ``/v1/faults``, ``/v1/nodes`` and ``/v1/nodes/{name}``."""
        router.add_get("/v1/faults", self.faults)
        router.add_get("/v1/nodes", self.list_nodes)
        router.add_get("/v1/nodes/{name}", self.node)

    def summary(self, name: str, agents: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """One node's summary (health, worst level, faults, agents, conditions); ``agents`` (node ->
        its connected agents, sorted) saves a pass over every stream when listing all nodes. A node
        without conditions, stale agents or pending sources (most of them) costs no pass over those."""
        if agents is None:
            agents = _agents_by_node(self.agents.connected())
        health, worst = self.nodes.health(name)
        st = self.nodes.get(name)
        if st is None:
            conditions: list[dict[str, Any]] = []
            stale: list[dict[str, Any]] = []
            ip = status = ""
            pending: list[str] = []
        else:
            conditions = [c for c in st.conditions.values() if c.get("active")] if st.conditions else []
            stale = self.nodes.stale_conditions(name) if st.stale else []
            pending = self.nodes.pending_sources(name) if st.pending else []
            ip, status = st.node_ip, st.node_status
        return {
            "name": name,
            "health": health,
            "worst_level": worst,
            "faults": self.center.fault_count(name),
            "agents": agents.get(name, []),
            "node_ip": ip,
            "node_status": status,
            "conditions": conditions + stale if stale else conditions,
            "pending_sources": pending,
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

    def list_body(self) -> bytes:
        """The ``/v1/nodes`` body: the JSON list of every node's :meth:`summary`, sorted by name (the
        bytes ``json_response`` writes). A node's JSON is kept while its plain fields (health, worst
        level, fault count, agents, address, status) stay the same and it has no conditions, stale
        agents or pending sources; other nodes are written afresh each time."""
        agents = _agents_by_node(self.agents.connected())  # once per request, not once per node
        names = self.nodes.all_names() | agents.keys()
        if len(self._json) > len(names) + 1024:  # forgotten nodes: drop their JSON
            self._json = {n: v for n, v in self._json.items() if n in names}
        center_health, state_of, count_of = self.center.node_health, self.nodes.get, self.center.fault_count
        cache, out = self._json, []
        for n in self._sorted(names):
            st = state_of(n)
            if st is None:
                ip = status = ""
            elif st.conditions or st.stale or st.pending:
                out.append(_dumps(self.summary(n, agents)))
                continue
            else:
                ip, status = st.node_ip, st.node_status
            key = (with_status(center_health(n), st), count_of(n), agents.get(n), ip, status)
            got = cache.get(n)
            if got is None or got[0] != key:
                got = cache[n] = (key, _dumps(self.summary(n, agents)))
            out.append(got[1])
        return b"[" + b",".join(out) + b"]"

    async def list_nodes(self, request: web.Request) -> web.Response:
        return web.Response(body=self.list_body(), content_type="application/json")

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
