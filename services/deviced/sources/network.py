"""Network signals of the chips (reference deviced.md §1.1 "Link status", §2): the hccn_tool link
check and the gateway probe. Both only feed the engine; the 20 s / 60 s link-down rule that turns
them into a fault level is the engine's duration rule (:mod:`deviced.rules`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from deviced.chipio import CALL_ERRORS
from deviced.sources.base import Deps
from faultmesh.dcmi.structs import network_probe_healthy
from faultmesh.log import event
from faultmesh.model import Fault
from faultmesh.source import PolledSource, PushSource, Support

log = logging.getLogger("deviced")


class LinkCheck(PushSource):
    """hccn_tool link state for chips that have no network code, at most once per
    ``--link-check-interval`` s per chip, run in the cycle: DOWN raises 81078603 (which then runs the
    20 s rule); UP recovers the 81078603 this check raised. ``monotonic`` (s) is injectable."""

    name = "link-check"
    fault_sources = ()  # the engine's sink reports (and readies) dcmi / lingqu

    def __init__(self, deps: Deps) -> None:
        super().__init__()
        self.deps = deps
        self.monotonic = time.monotonic
        self.checked: dict[int, float] = {}

    def supported(self) -> Support:
        """Off with ``--link-check-interval 0``."""
        if self.deps.args.link_check_interval <= 0:
            return Support(False, "--link-check-interval 0")
        return Support(True)

    async def on_cycle(self) -> None:
        """Check the chips that are due (see class docstring)."""
        eng, io = self.deps.engine, self.deps.io
        interval = self.deps.args.link_check_interval
        if interval <= 0 or not hasattr(io.backend, "link_up"):
            return
        now = self.monotonic()
        for logic, ids in io.ids.items():
            if not eng.link_check_wanted(logic):
                continue  # the driver reports network codes itself
            if now - self.checked.get(logic, -1e18) < interval:
                continue
            self.checked[logic] = now
            try:
                up = await io.call("hccn_link", io.backend.link_up, ids, timeout_s=10)
            except CALL_ERRORS:
                continue
            if up is None or not eng.set_link(logic, up):
                continue
            if up:
                event(log, logging.INFO, "link up found by hccn_tool", logic_id=logic, phy_id=ids.phy)
            else:
                event(log, logging.WARNING, "link down found by hccn_tool", logic_id=logic, phy_id=ids.phy)


class GatewayProbe(PolledSource):
    """The gateway probe (``network_health``) of every chip every ``--probe-interval`` s (2.5), 1 s
    timeout per call in the probe's own pool; a changed result raises / recovers the synthetic
    GATEWAY_PROBE code in the engine (feeding the 20 s rule)."""

    name = "gateway-probe"
    fault_sources = ()  # the engine's sink reports (and readies) dcmi / lingqu

    def __init__(self, deps: Deps) -> None:
        super().__init__()
        self.deps = deps
        self.interval_s = max(0.05, float(deps.args.probe_interval))
        self.jitter = 0.0
        self.timeout_s = 60.0  # a pass over all chips; each call has its own 1 s timeout

    def supported(self) -> Support:
        """Off with ``--probe-interval 0``."""
        if self.deps.args.probe_interval <= 0:
            return Support(False, "--probe-interval 0")
        return Support(True)

    async def poll(self) -> Iterable[Fault]:
        """Probe each chip; a failed call skips the chip this pass. Emits into the engine only."""
        eng, io = self.deps.engine, self.deps.io
        assert io.backend is not None
        for logic, ids in io.ids.items():
            try:
                result = await io.call(
                    "network_health", io.backend.network_health, ids, timeout_s=1.0, pool=io.probe_pool
                )
            except CALL_ERRORS:
                continue
            if eng.set_probe(logic, network_probe_healthy(result)):
                event(log, logging.INFO, "gateway probe changed", logic_id=logic, result=result)
                self.deps.wake()
        return ()

    def publish(self, faults: Iterable[Fault]) -> None:
        """Nothing to publish: the engine holds the probe state and the cycle reports it."""

    async def on_cycle(self) -> None:
        """No per-cycle work: this source runs on its own poll."""
