"""ClusterD's read API over HTTP (issue 2): ``GET /v1/faults``, ``GET /v1/nodes``, ``GET /v1/nodes/<name>``.

``/v1/faults`` takes optional ``node``, ``level`` and ``source`` query filters and returns a JSON list of
fault objects (see :func:`clusterd.center.fault_dict`; ``ack``: the operator's acknowledgement that
covers it, :mod:`clusterd.acks`, or null). ``/v1/nodes`` lists every node known from
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

from clusterd.acks import AckOf, no_ack
from clusterd.center import FaultCenter, fault_dict
from clusterd.ingest.agents import AgentHub
from clusterd.nodes import NodeRegistry
from clusterd.pieces import ChangeReader, SortedPieces
from faultmesh.httpd import found_or_404, json_response
from faultmesh.levels import KNOWN_LEVELS
from faultmesh.model import Fault

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS  # as json_response writes


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


class NodeApi:
    """The fault and node routes over the fault center, node registry and agent hub."""

    def __init__(
        self, center: FaultCenter, nodes: NodeRegistry, agents: AgentHub, ack_of: AckOf = no_ack
    ) -> None:
        """``ack_of``: the acknowledgement in force that covers a fault, or None
        (:meth:`clusterd.acks.AckBook.ack_of`); listed as the fault's ``ack``."""
        self.center = center
        self.ack_of = ack_of
        self.nodes = nodes
        self.agents = agents
        self._changed: ChangeReader | None = None  # from the first list_body() on
        self._json: SortedPieces[bytes] = SortedPieces(b",")  # node -> its summary JSON

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register ``/v1/faults``, ``/v1/nodes`` and ``/v1/nodes/{name}``."""
        router.add_get("/v1/faults", self.faults)
        router.add_get("/v1/nodes", self.list_nodes)
        router.add_get("/v1/nodes/{name}", self.node)

    def summary(self, name: str, agents: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """One node's summary (health, worst level, faults, agents, conditions); ``agents`` (node ->
        its connected agents, sorted) saves a lookup per node when listing all nodes. A node
        without conditions, stale agents or pending sources (most of them) costs no pass over those."""
        if agents is None:
            agents = {name: self.agents.agents_of(name)}
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
            if q["level"] not in KNOWN_LEVELS:  # as the CLI refuses it: never a silent empty list
                known = ", ".join(sorted(KNOWN_LEVELS))
                return json_response(
                    {"error": f"unknown fault level {q['level'][:64]!r}; known: {known}"}, 400
                )
            items = [f for f in items if f.level == q["level"]]
        if "source" in q:
            items = [f for f in items if f.source == q["source"] or f.source.startswith(q["source"] + ":")]
        return json_response([self.fault_json(f) for f in items])

    def fault_json(self, f: Fault) -> dict[str, Any]:
        """:func:`clusterd.center.fault_dict` plus ``ack``: the acknowledgement that covers it, or null."""
        d = fault_dict(f)
        d["ack"] = self.ack_of(f)
        return d

    def _render(self, name: str) -> None:
        """Put ``name``'s summary JSON in the list, or drop it when no longer known."""
        agents = self.agents.agents_of(name)
        if agents or name in self.nodes or self.center.fault_count(name):
            self._json.put(name, _dumps(self.summary(name, {name: agents})))
        else:
            self._json.drop(name)

    def list_body(self) -> bytes:
        """The ``/v1/nodes`` body: the JSON list of every node's :meth:`summary`, sorted by name (the
        bytes ``json_response`` writes). Every node is written at the first call; then only the
        nodes the fault center and the node registry marked changed since the last call
        (:class:`clusterd.pieces.NodeChanges`; an agent's connect and disconnect touch the registry)
        are written again, and only the chunks holding them are joined again."""
        if self._changed is None:
            self._changed = self.center.node_changes.reader()
            agents = _agents_by_node(self.agents.connected())
            names = self.nodes.all_names() | agents.keys()
            self._json.reset((n, _dumps(self.summary(n, agents))) for n in names)
        else:
            for n in self._changed.take():
                self._render(n)
        return b"[" + self._json.join() + b"]"

    async def list_nodes(self, request: web.Request) -> web.Response:
        return web.Response(body=self.list_body(), content_type="application/json")

    def node_body(self, name: str) -> dict[str, Any] | None:
        """The ``/v1/nodes/<name>`` object (:meth:`summary` plus ``fault_list``, ``devices`` and the
        agents' Hello ``labels``: agent -> labels), or
        None when clusterd does not know ``name``."""
        if name not in self.nodes and name not in self.center.node_names():
            return None
        body = self.summary(name)
        body["fault_list"] = [self.fault_json(f) for f in self.center.faults(name)]
        st = self.nodes.get(name)
        body["devices"] = list(st.devices.values()) if st else []
        body["labels"] = st.labels if st else {}  # agent -> its Hello's labels (its modes)
        return body

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return found_or_404(self.node_body(name), f"node {name} not known")


def _agents_by_node(connected: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(node, agent) pairs (sorted) -> node -> its agents, in that order."""
    out: dict[str, list[str]] = {}
    for node, agent in connected:
        out.setdefault(node, []).append(agent)
    return out
