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
(``registry.get_sample_value``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest

from clusterd.nodes import HEALTH_STATES, SLOW_NODE_CODE, NodeRegistry

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


class NodeHealthCollector:
    """The four per-node families (module docstring) over ``nodes`` and ``center``."""

    SLOW_NODE_CODE = SLOW_NODE_CODE

    def __init__(self, nodes: NodeRegistry, center: FaultCenter) -> None:
        self._nodes = nodes
        self._center = center
        self._skip = False  # inside exposition(): the text is written by text(), not collect()

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

    def text(self) -> bytes:
        """The four families in the Prometheus text format (0.0.4), as ``generate_latest`` writes them."""
        out: list[str] = []
        for name, rows in self.rows().items():
            out.append(f"# HELP {name} {_HELP[name]}\n# TYPE {name} gauge\n")
            keys = _LABELS[name]
            if len(keys) == 1:
                k = keys[0]
                out.extend(f'{name}{{{k}="{_esc(v[0])}"}} {float(x)!r}\n' for v, x in rows)
            else:  # prometheus_client writes the labels sorted by name
                (i, k1), (j, k2) = sorted(enumerate(keys), key=lambda p: p[1])
                out.extend(
                    f'{name}{{{k1}="{_esc(v[i])}",{k2}="{_esc(v[j])}"}} {float(x)!r}\n' for v, x in rows
                )
        return "".join(out).encode()

    def exposition(self, registry: CollectorRegistry) -> bytes:
        """The whole ``/metrics`` body: ``generate_latest(registry)`` without these families, then
        :meth:`text`."""
        self._skip = True
        try:
            head = generate_latest(registry)
        finally:
            self._skip = False
        return head + self.text()
