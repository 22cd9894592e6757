"""The per-fault series ``faultmesh_active_fault`` (issue 31) at 16k nodes x 10 faults: what one
scrape of it costs clusterd's event loop, in this process on a filled fault index.

Figures: the first scrape (renders every node), a scrape with nothing changed, a scrape after
``--changed`` nodes got one more fault each, at the default cap (10,000 series: the storm case, most
series left out) and with a cap above the series count (everything written). Baseline in the same
run: the same series through prometheus_client (``GaugeMetricFamily`` + ``generate_latest``), what
every scrape cost before the per-node change feed.

Run: ``.venv/bin/python bench/fault_series.py`` (about 30 s on 2 cores). The last line holds the
figures.
"""

from __future__ import annotations

import argparse
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from clusterd.faultindex import FaultIndex
from clusterd.faultseries import LABELS, MAX_FAULT_SERIES, NAME, FaultSeriesCollector
from faultmesh.model import Fault


def _ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


class _Plain:
    """The baseline: every series through prometheus_client at every scrape."""

    def __init__(self, index: FaultIndex, c: FaultSeriesCollector) -> None:
        self.index, self.c = index, c

    def collect(self):
        fam = GaugeMetricFamily(NAME, "baseline", labels=list(LABELS))
        for node in self.index.node_names():
            for labels, k in self.c.node_rows(node):
                fam.add_metric(list(labels), k)
        yield fam


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16384)
    ap.add_argument("--faults", type=int, default=10, help="faults per node")
    ap.add_argument("--changed", type=int, default=200, help="nodes changed between two scrapes")
    a = ap.parse_args()
    index = FaultIndex()
    for i in range(a.nodes):
        for d in range(a.faults):
            level = "SeparateNPU" if (d + i) % 7 == 0 else "SubHealthFault"
            index.put(Fault("deviced", f"node-{i:05d}", "NPU", d, f"80E1800{d}", level), "deviced")
    figures = {}
    for name, cap in (("cap", MAX_FAULT_SERIES), ("all", a.nodes * a.faults + 2 * a.changed)):
        c = FaultSeriesCollector(index, cap=cap)
        figures[f"{name}_first_ms"] = _ms(c.text)
        figures[f"{name}_unchanged_ms"] = min(_ms(c.text) for _ in range(3))
        for i in range(a.changed):
            node = f"node-{i * 7 % a.nodes:05d}"
            index.put(Fault("deviced", node, "NPU", 90 + len(name), "80E18008", "RestartNPU"), "deviced")
        figures[f"{name}_changed_ms"] = _ms(c.text)
        figures[f"{name}_bytes"] = len(c.text())
    reg = CollectorRegistry()
    reg.register(_Plain(index, FaultSeriesCollector(index)))
    figures["baseline_prometheus_client_ms"] = min(_ms(lambda: generate_latest(reg)) for _ in range(2))
    print(
        f"nodes={a.nodes} faults/node={a.faults} changed={a.changed} "
        + " ".join(f"{k}={v:.1f}" for k, v in figures.items())
    )


if __name__ == "__main__":
    main()
