"""Per-node health on ``/metrics`` (issues 17, 18), computed at scrape time from
:meth:`clusterd.nodes.NodeRegistry.health` and the fault center's maintained indexes.

``faultmesh_node_unhealthy{node}`` = 1 for every UnHealthy node; ``faultmesh_slow_node{node}`` = 1
while a slow-node fault (110001010) is active; ``faultmesh_agent_stale{node,agent}`` = 1 while that
agent's data is stale. Series of healthy nodes are absent, so their cardinality follows the broken
nodes only. ``faultmesh_node_health{node,health}`` is a state set over every known node: 1 for its
health (Healthy / SubHealthy / UnHealthy), 0 for the other two.

At 16k nodes the state set alone is 48k series: prometheus_client formats each sample in Python
(label-name checks, escaping) at ~10 µs a sample, so the HTTP scrape uses :meth:`exposition`, which
writes these four families as text directly (same text format, same lines) beside
``generate_latest`` for everything else. :meth:`collect` still serves the registry's API
(``registry.get_sample_value``). The text keeps each node's lines (its three state-set lines and
its unhealthy line) until that node's health changes, and the sorted node list until the set of
nodes changes, so a scrape costs one health lookup per node and a join.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest

from clusterd.nodes import HEALTH_STATES, SLOW_NODE_CODE, NodeRegistry, NodeState
from faultmesh.levels import UNHEALTHY

if TYPE_CHECKING:
    from clusterd.center import FaultCenter

_HELP = {
    "faultmesh_node_unhealthy": "1 while the node is UnHealthy (series absent otherwise)",
    "faultmesh_slow_node": "1 while a slow-node fault (110001010) is active on the node",
    "faultmesh_agent_stale": "1 while the agent's data on the node is not current: silent past "
    "--agent-stale-after-s or disconnected (series absent otherwise)",
    "faultmesh_node_health": "1 for the node's health, 0 for the others",
}
_LABELS = {
    "faultmesh_node_unhealthy": ("node",),
    "faultmesh_slow_node": ("node",),
    "faultmesh_agent_stale": ("node", "agent"),
    "faultmesh_node_health": ("node", "health"),
}


def _esc(v: str) -> str:
    """A label value escaped as the text format wants (backslash, newline, double quote)."""
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


def with_status(health: tuple[str, str], st: NodeState | None) -> tuple[str, str]:
    """:meth:`NodeRegistry.health`'s rule over the fault center's ``(health, worst level)`` of a node
    and its already-fetched state: UnHealthy when any reporter says so. For the per-node loops of
    a scrape (no registry call, no tuple, per node)."""
    if st is not None and st.status and UNHEALTHY in st.status.values():
        return UNHEALTHY, health[1]
    return health


class SortedNames:
    """``names(set)`` -> the set sorted, re-sorted only when the set differs from the last one."""

    def __init__(self) -> None:
        self._set: set[str] = set()
        self._list: list[str] = []

    def __call__(self, names: set[str]) -> list[str]:
        if names != self._set:
            self._set, self._list = names, sorted(names)
        return self._list


def _head(name: str) -> str:
    return f"# HELP {name} {_HELP[name]}\n# TYPE {name} gauge\n"


class NodeHealthCollector:
    """The four per-node families (module docstring) over ``nodes`` and ``center``."""

    SLOW_NODE_CODE = SLOW_NODE_CODE

    def __init__(self, nodes: NodeRegistry, center: FaultCenter) -> None:
        self._nodes = nodes
        self._center = center
        self._skip = False  # inside exposition(): the text is written by text(), not collect()
        self._lines: dict[str, tuple[str, str, str]] = {}  # node -> (health, state-set lines, unhealthy line)
        self._sorted = SortedNames()

    def rows(self) -> dict[str, list[tuple[tuple[str, ...], int]]]:
        """family name -> [(label values, value)], sorted by node; cost follows the nodes (health
        and slow-node reads are maintained indexes of the fault center, issue 18)."""
        health = {n: self._nodes.health(n).health for n in sorted(self._nodes.all_names())}
        return {
            "faultmesh_node_unhealthy": [((n,), 1) for n in sorted(self._nodes.unhealthy())],
            "faultmesh_slow_node": [((n,), 1) for n in sorted(self._center.nodes_with_code(SLOW_NODE_CODE))],
            "faultmesh_agent_stale": [((n, a), 1) for n, a in self._nodes.stale_agents()],
            "faultmesh_node_health": [
                ((n, h), int(h == now)) for n, now in health.items() for h in HEALTH_STATES
            ],
        }

    def collect(self):
        """The families for prometheus_client (nothing while :meth:`exposition` writes them)."""
        if self._skip:
            return
        from prometheus_client.core import GaugeMetricFamily

        for name, rows in self.rows().items():
            fam = GaugeMetricFamily(name, _HELP[name], labels=list(_LABELS[name]))
            for labels, value in rows:
                fam.add_metric(list(labels), value)
            yield fam

    def _sorted_names(self) -> list[str]:
        """Every known node, sorted (re-sorted only when the set of nodes changed)."""
        names = self._nodes.all_names()
        if len(self._lines) > len(names) + 1024:  # forgotten nodes: drop their lines
            self._lines = {n: v for n, v in self._lines.items() if n in names}
        return self._sorted(names)

    def _node_lines(self, node: str, health: str) -> tuple[str, str, str]:
        """(health, the node's three faultmesh_node_health lines, its faultmesh_node_unhealthy line
        or "")."""
        n = _esc(node)
        states = "".join(
            f'faultmesh_node_health{{health="{h}",node="{n}"}} {float(h == health)!r}\n'
            for h in HEALTH_STATES
        )
        bad = f'faultmesh_node_unhealthy{{node="{n}"}} 1.0\n' if health == UNHEALTHY else ""
        return health, states, bad

    def text(self) -> bytes:
        """The four families in the Prometheus text format (0.0.4), as ``generate_latest`` writes them
        (the same lines as :meth:`rows` through prometheus_client; a test compares them)."""
        center_health, state_of = self._center.node_health, self._nodes.get
        lines, make = self._lines, self._node_lines
        states: list[str] = []
        bad: list[str] = []
        for n in self._sorted_names():
            h = with_status(center_health(n), state_of(n))[0]
            got = lines.get(n)
            if got is None or got[0] != h:
                got = lines[n] = make(n, h)
            states.append(got[1])
            if got[2]:
                bad.append(got[2])
        slow = sorted(self._center.nodes_with_code(SLOW_NODE_CODE))
        stale = self._nodes.stale_agents()
        return "".join(
            [
                _head("faultmesh_node_unhealthy"),
                *bad,
                _head("faultmesh_slow_node"),
                *(f'faultmesh_slow_node{{node="{_esc(n)}"}} 1.0\n' for n in slow),
                _head("faultmesh_agent_stale"),
                *(f'faultmesh_agent_stale{{agent="{_esc(a)}",node="{_esc(n)}"}} 1.0\n' for n, a in stale),
                _head("faultmesh_node_health"),
                *states,
            ]
        ).encode()

    def exposition(self, registry: CollectorRegistry) -> bytes:
        """The whole ``/metrics`` body: ``generate_latest(registry)`` without these families, then
        :meth:`text`."""
        self._skip = True
        try:
            head = generate_latest(registry)
        finally:
            self._skip = False
        return head + self.text()
