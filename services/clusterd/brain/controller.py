"""The per-job recovery controller: the Recover state machine of clusterd.md §7 and §4.

One :class:`Controller` per registered job (Recover Register creates it), given the narrow
:class:`~clusterd.brain.ports.ControllerPorts` it uses of ClusterD (never the brain). It is made of:

- ``st``: its state, one :class:`~clusterd.brain.ctlstate.ControllerState` (the reference's state
  names INIT, NotifyStopTrain, WaitReportStopComplete, ..., the flow, its uuid, the cached faults);
  the state names and the moves allowed between them are one table, :mod:`clusterd.brain.states`,
  and every move is judged against it (:meth:`ControllerState.set_state`);
- ``io``: its :class:`~clusterd.brain.channel.SignalChannel` (the signal stream, report slots, O&M
  streams): a new subscription resets the controller and ends the older stream; when the stream
  ends the controller resets again;
- ``c``: the :class:`~clusterd.brain.ctlcore.ControllerCore` the flows hold (state, channel, ports,
  timeouts, the flow task and the shared steps);
- the flows, each one object over the core, each in its own module: ``recovery``
  (:mod:`.flows`: fault recovery, with the in-place, reschedule, elastic and platform steps),
  ``om`` (:mod:`.omflows`: NIC switch, stress test), ``hot_switch`` (:mod:`.hotswitch`). graceExit
  is the recovery's pre-exit then its dump.

At most one flow runs at a time; every wait ends (``report_s`` default 900 s, configurable so tests
use ms). Every decision is recorded through the ports' decision sink (logged and queryable over HTTP).
"""

from __future__ import annotations

from clusterd.brain.ctlcore import ControllerCore
from clusterd.brain.ctlstate import INIT, KEEP_ALIVE, FlowEnd, Timeouts, new_uuid
from clusterd.brain.flows import RecoveryFlow
from clusterd.brain.hotswitch import HotSwitchFlow
from clusterd.brain.omflows import OmFlows
from clusterd.brain.ports import ControllerPorts

__all__ = ["INIT", "KEEP_ALIVE", "Controller", "FlowEnd", "Timeouts", "new_uuid", "timeouts_from"]


class Controller:
    """The state machine of one job (module docstring)."""

    def __init__(self, ports: ControllerPorts, job_id: str, timeouts: Timeouts) -> None:
        self.job_id = job_id
        self.c = ControllerCore(ports, job_id, timeouts)
        self.st = self.c.st
        self.io = self.c.io
        self.recovery = RecoveryFlow(self.c)
        self.om = OmFlows(self.c, self.recovery)
        self.hot_switch = HotSwitchFlow(self.c)
        # the flow task, and the report slots as the Recover servicer and tests drive them
        self.busy, self.start_flow, self.reset = self.c.busy, self.c.start_flow, self.c.reset
        self.expect, self.wait, self._slot = self.io.expect, self.io.wait, self.io._slot

    # what the servicers, views and tests read of the state
    state = property(lambda self: self.st.state)
    cached_faults = property(lambda self: self.st.cached_faults)
    restart_proc_pods = property(lambda self: self.st.restart_proc_pods)
    plat_strategy = property(lambda self: self.st.plat_strategy)
    subscribed = property(lambda self: self.io.subscribed)

    @property
    def uuid(self) -> str:
        """The flow's signal uuid ("" between flows); set by tests to stand for a flow's."""
        return self.st.uuid

    @uuid.setter
    def uuid(self, value: str) -> None:
        self.st.uuid = value

    async def stream(self, job_id: str):
        """Async generator serving SubscribeProcessManageSignal: resets the controller, then yields
        its signals (a keep-alive every ``keepalive_s``) until a newer subscription replaces it or the
        controller closes; the end of the current stream resets the controller again."""
        await self.c.reset("new signal subscription")
        q, gen = self.io.open_stream()
        try:
            while (item := await self.io.next_signal(q, job_id)) is not None:
                sig, written = item
                yield sig
                if written is not None and not written.done():
                    written.set_result(True)
        finally:
            if self.io.end_stream(q, gen):
                await self.c.reset("signal stream ended")

    def start_om(self, kind: str) -> None:
        """Begin an O&M operation (``nic`` | ``stress``): its single reply future is visible to the
        O&M subscriber at once."""
        self.st.om_kind = kind
        self.io.start_om()

    async def close(self) -> None:
        """Stop everything (job deleted or ClusterD stopping): the streams end."""
        await self.c.reset("controller closed")
        self.io.close()


def timeouts_from(a) -> Timeouts:
    """The controllers' :class:`Timeouts` from ClusterD's flags (``--report-timeout-s`` ...; s)."""
    return Timeouts(
        report_s=a.report_timeout_s,
        keepalive_s=a.keepalive_s,
        flush_s=a.fault_flush_s,
        hot_switch_wait_s=a.hot_switch_wait_s,
        scale_wait_s=a.scale_wait_s,
        send_s=a.signal_send_s,
        command_gap_s=a.command_gap_s,
        fault_retry_s=a.fault_retry_s,
        hccl_route_s=a.hccl_route_s,
        poll_s=min(1.0, max(0.01, a.report_timeout_s / 10)),
        subscriber_wait_s=min(10.0, a.report_timeout_s),
        in_place_wait_s=a.in_place_wait_s,
        pre_exit_wait_s=a.pre_exit_wait_s,
        platform_s=a.platform_wait_s,
        job_wait_scale=a.job_wait_scale,
    )
