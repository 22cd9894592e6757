"""One series per active fault on ``/metrics`` (issue 31), read from the fault index at scrape time.

``faultmesh_active_fault{node,device_type,device,code,level}`` = how many active fault records have
those five values (one per reporting source: a fault that noded and deviced both report is 2). The
labels are bounded by the cluster: nodes, device types (NPU, Node, CPU, Switch, ...), device ids
(``-1`` for the node itself), codes of the fault tables and levels. No fault id, source or time is a
label, so a fault that recurs keeps its series (like dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS{gpu}``), and one that recovers drops it.

At most :data:`MAX_FAULT_SERIES` series are written per scrape (documented in docs/metrics.md, a test
compares the two): past the cap the most severe levels win (:func:`faultmesh.levels.level_severity`),
then node, device type, device and code order, and ``faultmesh_active_fault_series_dropped`` says how
many series were left out (0 otherwise), so a fault storm cannot blow up Prometheus' memory and
the operator sees that it was cut.

The collector only reads (:meth:`clusterd.faultindex.FaultIndex.faults`); the fault center's writer
knows nothing of it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from faultmesh.levels import level_severity

if TYPE_CHECKING:
    from clusterd.faultindex import FaultIndex

MAX_FAULT_SERIES = 10000
"""Most ``faultmesh_active_fault`` series in one scrape (docs/metrics.md)."""

LABELS = ("node", "device_type", "device", "code", "level")


class FaultSeriesCollector:
    """prometheus_client collector of the per-fault series (module docstring) over ``index``.

    ``cap``: most series per scrape (default :data:`MAX_FAULT_SERIES`, > 0).
    """

    def __init__(self, index: FaultIndex, cap: int = MAX_FAULT_SERIES) -> None:
        if cap <= 0:
            raise ValueError(f"cap must be positive, got {cap}")
        self._index = index
        self._cap = cap

    def rows(self) -> tuple[list[tuple[tuple[str, str, str, str, str], int]], int]:
        """([(label values in :data:`LABELS` order, records)], series dropped by the cap), sorted by
        node, device type, device, code, level."""
        counts = Counter(
            (f.node, f.device_type, str(f.device_id), f.code, f.level) for f in self._index.faults()
        )
        keys = list(counts)
        dropped = max(0, len(keys) - self._cap)
        if dropped:
            keys.sort(key=lambda k: (-level_severity(k[4]), k))
            keys = keys[: self._cap]
        return [(k, counts[k]) for k in sorted(keys)], dropped

    def collect(self):
        """The two families for prometheus_client."""
        from prometheus_client.core import GaugeMetricFamily

        rows, dropped = self.rows()
        fam = GaugeMetricFamily(
            "faultmesh_active_fault",
            "Active fault records by node, device and code (series absent once recovered)",
            labels=list(LABELS),
        )
        for labels, n in rows:
            fam.add_metric(list(labels), n)
        yield fam
        yield GaugeMetricFamily(
            "faultmesh_active_fault_series_dropped",
            f"faultmesh_active_fault series left out of this scrape by the cap of {self._cap}",
            value=dropped,
        )

    def describe(self):
        """Nothing: no scrape at registration (the index may still be loading)."""
        return []
