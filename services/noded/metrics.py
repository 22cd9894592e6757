"""noded's Prometheus metrics (issue 3 "Ops"; the reference NodeD has none, noded.md §8)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

POLL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class NodedMetrics:
    """All noded metrics on one registry.

    - ``faultmesh_noded_bmc_poll_duration_seconds{mode}``: wall time of one BMC poll (s), success or not;
    - ``faultmesh_noded_bmc_polls_total{result}``: ok / failed (BMC unreachable, unsupported) / rejected (bad reply);
    - ``faultmesh_noded_bmc_errors_total{kind}``: timeout, unreachable, auth, busy, completion-code, oem-<reason>,
      sel-<reason>, internal;
    - ``faultmesh_noded_bmc_last_success_timestamp_seconds``: unix time of the last successful poll;
    - ``faultmesh_noded_faults{source,level}``: current faults by source and level;
    - ``faultmesh_noded_unknown_fault_codes_total``: appearances of codes not in the level table;
    - ``faultmesh_noded_sel_records_total{result}``: SEL records read (mapped, unmapped, oem, unknown_type);
    - ``faultmesh_noded_level_table_reloads_total{result}``: ok / invalid / missing;
    - ``faultmesh_noded_storage_reads_total{monitor,result}``: DPC/DTFS status file reads (ok or a reason);
    - ``faultmesh_noded_node_status{status}``: 1 for the current node status;
    - ``faultmesh_noded_state_file_rejected_total{reason}``: ``--bmc-state-file`` files rejected at
      start (unreadable, corrupt, not-an-object, bad-shape): noded started with no kept times.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.poll_duration = Histogram(
            "faultmesh_noded_bmc_poll_duration_seconds",
            "Duration of one BMC poll",
            ["mode"],
            buckets=POLL_BUCKETS,
            registry=registry,
        )
        self.polls = Counter(
            "faultmesh_noded_bmc_polls_total", "BMC polls by result", ["result"], registry=registry
        )
        self.bmc_errors = Counter(
            "faultmesh_noded_bmc_errors_total", "BMC errors by kind", ["kind"], registry=registry
        )
        self.last_success = Gauge(
            "faultmesh_noded_bmc_last_success_timestamp_seconds",
            "Unix time of the last successful BMC poll",
            registry=registry,
        )
        self.faults = Gauge(
            "faultmesh_noded_faults", "Current node faults", ["source", "level"], registry=registry
        )
        self.unknown_codes = Counter(
            "faultmesh_noded_unknown_fault_codes_total",
            "Fault codes not in the level table (reported as NotHandleFault)",
            registry=registry,
        )
        self.sel_records = Counter(
            "faultmesh_noded_sel_records_total", "SEL records read", ["result"], registry=registry
        )
        self.level_reloads = Counter(
            "faultmesh_noded_level_table_reloads_total",
            "Fault level table reloads",
            ["result"],
            registry=registry,
        )
        self.storage_reads = Counter(
            "faultmesh_noded_storage_reads_total",
            "DPC/DTFS status file reads",
            ["monitor", "result"],
            registry=registry,
        )
        self.state_file_rejected = Counter(
            "faultmesh_noded_state_file_rejected_total",
            "State files rejected at start (noded started with empty state)",
            ["reason"],
            registry=registry,
        )
        self.node_status = Gauge(
            "faultmesh_noded_node_status", "1 for the current node status", ["status"], registry=registry
        )

    def set_node_status(self, status: str) -> None:
        """Make ``status`` the one with value 1."""
        for s in ("Healthy", "PreSeparate", "UnHealthy"):
            self.node_status.labels(s).set(1 if s == status else 0)
