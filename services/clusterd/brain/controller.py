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

__all__ = ["INIT", "KEEP_ALIVE", "Controller", "ControllerBase", "FlowEnd", "Timeouts", "new_uuid"]


class Controller(RecoveryFlows, OmFlows):
    """The state machine of one job (module docstring). ``brain`` gives job data and decisions."""
