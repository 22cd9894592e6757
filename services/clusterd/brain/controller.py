"""The per-job recovery controller: the Recover state machine of clusterd.md §7 and §4.

One :class:`Controller` per registered job (Recover Register creates it). It owns:

- the signal stream (``SubscribeProcessManageSignal``): a 1-slot queue of ProcessManageSignal,
  ``keep-alive`` every ``keepalive_s``; a new subscription resets the controller and ends the older
  stream; when the stream ends the controller resets again;
- report slots (ReportStopComplete / ReportRecoverStrategy / ReportRecoverStatus, ReplySwitchNicResult,
  ReplyStressTestResult): a report is consumed only while the flow waits for that kind, otherwise it
  is dropped as "order mix" (§7.2) and the call still answers 0 as the reference does;
- at most one *flow* task: fault recovery, NIC switch, stress test, sub-health hot switch or grace
  exit. Every wait ends (``report_s`` default 900 s, configurable so tests use ms).

States use the reference's names (INIT, NotifyStopTrain, WaitReportStopComplete, ...). Every
decision is recorded through ``brain.decide(job_id, ...)`` (logged and queryable over HTTP).
"""

from __future__ import annotations

from clusterd.brain.ctlbase import INIT, KEEP_ALIVE, ControllerBase, FlowEnd, Timeouts, new_uuid
from clusterd.brain.flows import RecoveryFlows
from clusterd.brain.omflows import OmFlows

__all__ = [
    "INIT", "KEEP_ALIVE", "Controller", "ControllerBase", "FlowEnd", "Timeouts", "new_uuid", "timeouts_from",
]  # fmt: skip


class Controller(RecoveryFlows, OmFlows):
    """The state machine of one job (module docstring). ``brain`` gives job data and decisions."""


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
