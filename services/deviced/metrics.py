"""deviced's own metrics (issue 4 "Ops"), exported at scrape time from the engine and the sources:
``faultmesh_deviced_events{source,level}``, ``..._event_outcomes{outcome}``,
``..._callback_drops{kind}`` (chip: token bucket; switch: queue full), ``..._callbacks``,
``..._unknown_event_types``, ``..._dcmi_errors{call,reason}``, ``..._state_file_rejected{reason}``,
``..._grace_episodes{result}`` (graceful tolerance: started / recovered / failed / excluded);
plus the cycle's ``faultmesh_deviced_poll_duration_seconds`` histogram and
``faultmesh_deviced_subscribed``."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class DevicedCollector(Collector):
    """Exports exact counters at scrape time. ``app`` is a :class:`deviced.app.DeviceD` (engine,
    chip and switch sources, io)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self):
        """The counter families (see module docstring)."""
        app = self.app
        ev = CounterMetricFamily(
            "faultmesh_deviced_events",
            "Fault events handled, by source and level",
            labels=["source", "level"],
        )
        for (src, level), n in sorted(app.engine.levels_by_event.items()):
            ev.add_metric([src, level], n)
        yield ev
        out = CounterMetricFamily("faultmesh_deviced_event_outcomes", "Event outcomes", labels=["outcome"])
        for k, n in sorted(app.engine.stats.items()):
            out.add_metric([k], n)
        yield out
        drops = CounterMetricFamily(
            "faultmesh_deviced_callback_drops",
            "Callbacks dropped: chip (token bucket) or switch (queue full)",
            labels=["kind"],
        )
        drops.add_metric(["chip"], app.callback_drops)
        drops.add_metric(["switch"], app.switch_drops)
        yield drops
        cbs = CounterMetricFamily("faultmesh_deviced_callbacks", "Callbacks received from the driver")
        cbs.add_metric([], app.callbacks)
        yield cbs
        unk = CounterMetricFamily(
            "faultmesh_deviced_unknown_event_types",
            "Callbacks with an event type other than a DMS fault event",
        )
        dcmi = getattr(app.io.backend, "dcmi", None)
        unk.add_metric([], getattr(dcmi, "unknown_events", 0))
        yield unk
        xids = CounterMetricFamily(
            "faultmesh_deviced_nvml_unknown_xids", "NVIDIA XID events not in the fault table (default level)"
        )
        xids.add_metric([], sum(getattr(app.io.backend, "unknown_xids", {}).values()))
        yield xids
        errs = CounterMetricFamily(
            "faultmesh_deviced_dcmi_errors", "Failed DCMI calls", labels=["call", "reason"]
        )
        for (call, reason), n in sorted(app.io.call_errors.items()):
            errs.add_metric([call, reason], n)
        yield errs
        rej = CounterMetricFamily(
            "faultmesh_deviced_state_file_rejected",
            "State files rejected at start (deviced started with empty rule state), by reason",
            labels=["reason"],
        )
        for reason, n in sorted(getattr(getattr(app, "state_file", None), "rejected", {}).items()):
            rej.add_metric([reason], n)
        yield rej
        bad = CounterMetricFamily(
            "faultmesh_deviced_table_reload_failures",
            "Table reloads rejected (the last good table stays), by table",
            labels=["table"],
        )
        reloader = getattr(app, "reloader", None)
        for table, n in sorted(getattr(reloader, "failures", {}).items()):
            bad.add_metric([table], n)
        yield bad
        grace = getattr(app, "grace", None)
        if grace is not None and grace.on:
            ep = CounterMetricFamily(
                "faultmesh_deviced_grace_episodes",
                "Graceful-tolerance episodes (--grace-tolerance), by result: started, recovered, failed; "
                "excluded: jobs with process-level recovery that get none (Job-level rescheduling)",
                labels=["result"],
            )
            for result, n in (
                ("started", grace.episodes),
                ("recovered", grace.recovered),
                ("failed", grace.failed),
                ("excluded", grace.excluded),
            ):
                ep.add_metric([result], n)
            yield ep


class CycleMetrics:
    """The cycle's histogram and the subscription gauge, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.poll_seconds = Histogram(
            "faultmesh_deviced_poll_duration_seconds",
            "Duration of one deviced cycle's DCMI polling",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 1, 5, 30),
            registry=registry,
        )
        self.subscribed = Gauge(
            "faultmesh_deviced_subscribed", "1 while fault events come by subscription", registry=registry
        )
