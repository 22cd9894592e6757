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
(``registry.get_sample_value``). The text keeps each node's lines (its three state-set lines, its
unhealthy line, its stale-agent lines) in name order, in chunks (:class:`clusterd.pieces.SortedPieces`),
and re-renders only the nodes the fault center and the node registry marked changed since the last
scrape (:class:`clusterd.pieces.NodeChanges`): a scrape costs the changed nodes, the chunks that
hold them and one join, not a visit of every node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest

from clusterd.nodes import HEALTH_STATES, SLOW_NODE_CODE, NodeRegistry, with_status
from clusterd.pieces import ChangeReader, SortedPieces
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


def _head(name: str) -> bytes:
    return f"# HELP {name} {_HELP[name]}\n# TYPE {name} gauge\n".encode()


class NodeHealthCollector:
    """The four per-node families (module docstring) over ``nodes`` and ``center``'s index."""

    SLOW_NODE_CODE = SLOW_NODE_CODE

    def __init__(self, nodes: NodeRegistry, center: FaultCenter) -> None:
        self._nodes = nodes
        self._faults = center.index  # the center's faults, read only
        self._skip = False  # inside exposition(): the text is written by text(), not collect()
        self._changed: ChangeReader | None = None  # from the first text() on
        self._states: SortedPieces[bytes] = SortedPieces(b"")  # node -> its state-set lines
        self._bad: SortedPieces[bytes] = SortedPieces(b"")  # UnHealthy node -> its unhealthy line
        self._stale: SortedPieces[bytes] = SortedPieces(b"")  # node with stale agents -> their lines

    def rows(self) -> dict[str, list[tuple[tuple[str, ...], int]]]:
        """family name -> [(label values, value)], sorted by node; cost follows the nodes (health
        and slow-node reads are maintained indexes of the fault center, issue 18)."""
        health = {n: self._nodes.health(n).health for n in sorted(self._nodes.all_names())}
        return {
            "faultmesh_node_unhealthy": [((n,), 1) for n in sorted(self._nodes.unhealthy())],
            "faultmesh_slow_node": [((n,), 1) for n in sorted(self._faults.nodes_with_code(SLOW_NODE_CODE))],
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

    def _render(self, node: str) -> None:
        """Put (or drop, when no longer known) ``node``'s pieces: its three faultmesh_node_health
        lines, its faultmesh_node_unhealthy line while UnHealthy, its faultmesh_agent_stale lines."""
        st = self._nodes.get(node)
        if st is None and not self._faults.fault_count(node):  # gone: in neither registry nor center
            self._states.drop(node)
            self._bad.drop(node)
            self._stale.drop(node)
            return
        health = with_status(self._faults.node_health(node), st)[0]
        n = _esc(node)
        self._states.put(
            node,
            "".join(
                f'faultmesh_node_health{{health="{h}",node="{n}"}} {float(h == health)!r}\n'
                for h in HEALTH_STATES
            ).encode(),
        )
        if health == UNHEALTHY:
            self._bad.put(node, f'faultmesh_node_unhealthy{{node="{n}"}} 1.0\n'.encode())
        else:
            self._bad.drop(node)
        if st is not None and st.stale:
            self._stale.put(
                node,
                "".join(
                    f'faultmesh_agent_stale{{agent="{_esc(a)}",node="{n}"}} 1.0\n' for a in sorted(st.stale)
                ).encode(),
            )
        else:
            self._stale.drop(node)

    def text(self) -> bytes:
        """The four families in the Prometheus text format (0.0.4), as ``generate_latest`` writes them
        (the same lines as :meth:`rows` through prometheus_client; a test compares them). Renders
        every node at the first call, then only the nodes marked changed since the last
        (:class:`clusterd.pieces.NodeChanges`)."""
        if self._changed is None:
            self._changed = self._faults.node_changes.reader()
            todo: set[str] = self._nodes.all_names()
        else:
            todo = self._changed.take()
        for n in todo:
            self._render(n)
        slow = sorted(self._faults.nodes_with_code(SLOW_NODE_CODE))
        return b"".join(
            [
                _head("faultmesh_node_unhealthy"),
                self._bad.join(),
                _head("faultmesh_slow_node"),
                *(f'faultmesh_slow_node{{node="{_esc(n)}"}} 1.0\n'.encode() for n in slow),
                _head("faultmesh_agent_stale"),
                self._stale.join(),
                _head("faultmesh_node_health"),
                self._states.join(),
            ]
        )

    def exposition(self, registry: CollectorRegistry) -> bytes:
        """The whole ``/metrics`` body: ``generate_latest(registry)`` without these families, then
        :meth:`text`."""
        self._skip = True
        try:
            head = generate_latest(registry)
        finally:
            self._skip = False
        return head + self.text()
