"""The agent-state sink: what the cycle reports to clusterd (reference deviced.md §1.2 "reporting").

Each report replaces the ``dcmi`` and ``lingqu`` sources of the :class:`faultmesh.agent.AgentState`
with :mod:`deviced.faults`' records and sets one DeviceState per chip (the agent stream sends only
the deltas), and updates the per-chip health gauges.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from deviced import faults
from deviced.engine import FaultEngine
from deviced.switch import SwitchState
from faultmesh.agent import AgentState


class AgentStateSink:
    """Publishes the engine and switch state into ``state`` (see module docstring)."""

    def __init__(self, state: AgentState, node: str, registry: CollectorRegistry) -> None:
        self.state = state
        self.node = node
        self.health_gauge = Gauge(
            "faultmesh_deviced_device_healthy",
            "1 when the chip is Healthy, 0 otherwise",
            ["node", "device"],
            registry=registry,
        )
        self.net_gauge = Gauge(
            "faultmesh_deviced_device_network_healthy",
            "1 when the chip's network is Healthy, 0 otherwise",
            ["node", "device"],
            registry=registry,
        )

    def expect(self) -> None:
        """Mark ``dcmi`` and ``lingqu`` pending in the agent state (call before the stream starts):
        ClusterD keeps what it had for them until the first complete report (issue 20)."""
        self.state.expect_sources((faults.SOURCE, faults.SWITCH_SOURCE))

    def publish(
        self,
        engine: FaultEngine,
        switch: SwitchState,
        spod: dict[int, tuple[int, int]],
        chips_complete: bool = True,
        switch_complete: bool = True,
    ) -> None:
        """Push the current view into the agent state (deltas go out on their own). ``chips_complete``
        / ``switch_complete``: the view of that source is complete (every chip polled once since the
        start / the switch's first full query done), which readies it (see :meth:`expect`)."""
        self.state.replace_source(faults.SOURCE, faults.chip_faults(engine, self.node))
        self.state.replace_source(
            faults.SWITCH_SOURCE, faults.switch_faults(switch, self.node, bool(engine.resetting()))
        )
        ready = [faults.SOURCE] if chips_complete else []
        ready += [faults.SWITCH_SOURCE] if switch_complete else []
        self.state.source_ready(ready)
        for dev in faults.device_states(engine, spod):
            self.state.set_device(dev)
        for d in engine.devices.values():
            self.health_gauge.labels(self.node, str(d.ids.phy)).set(1 if d.health == "Healthy" else 0)
            self.net_gauge.labels(self.node, str(d.ids.phy)).set(1 if d.network_health == "Healthy" else 0)
