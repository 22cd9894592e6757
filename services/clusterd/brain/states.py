"""The per-job recovery controller's states and its allowed transitions, in one table (clusterd.md §7,
§4.2; the reference's recover controller state names, fault_recover_service / the controller's
state rules).

Every state a flow enters is a constant here; :data:`TRANSITIONS` maps each state to the states a
flow may move to from it. Two moves are always allowed and not listed: staying in the same state,
and going back to :data:`INIT` (a flow ends, fails or is cancelled: the reference's reset). The
"choose a strategy" step (:data:`CHOOSE`) is reached after the training side's strategy report and
after each failed strategy (the fallback).

:func:`check` judges one move. An illegal one is logged (``controller illegal transition``) and
counted in :data:`ILLEGAL` (process-wide: ``(from, to) -> times``; ClusterD exports it as
``faultmesh_brain_illegal_transitions_total{from,to}``); the move still happens -- a table gap never
stops a recovery. The tests fail on any illegal move (tests/conftest.py).
"""

from __future__ import annotations

import logging
from collections import Counter

from prometheus_client.core import CounterMetricFamily

from faultmesh.log import event

log = logging.getLogger("clusterd.brain")

INIT = "INIT"
# -- fault recovery (flows.py, inplace.py, reschedule.py, elastic.py, platform.py) ---------------
NOTIFY_WAIT_FAULT_FLUSHING = "NotifyWaitFaultFlushing"
WAIT_PLATFORM_STRATEGY = "WaitPlatformStrategy"
NOTIFY_STOP_TRAIN = "NotifyStopTrain"
WAIT_REPORT_STOP_COMPLETE = "WaitReportStopComplete"
WAIT_FAULT_FLUSH_FINISHED = "WaitFaultFlushFinished"
NOTIFY_GLOBAL_FAULT = "NotifyGlobalFault"
WAIT_PLATFORM_RESULT_FAULT = "WaitPlatformResultFault"
WAIT_FAULT_DISAPPEAR = "WaitFaultDisappear"
WAIT_REPORT_RECOVER_STRATEGY = "WaitReportRecoverStrategy"
WAIT_RESOURCES = "WaitResources"
WAIT_RANK_TABLE_READY = "WaitRankTableReady"
NOTIFY_DECIDED_STRATEGY = "NotifyDecidedStrategy"
WAIT_REPORT_STEP_RETRY_STATUS = "WaitReportStepRetryStatus"
WAIT_REPORT_PROCESS_RECOVER_STATUS = "WaitReportProcessRecoverStatus"
WAIT_REPORT_SCALE_IN_ISOLATE_RANKS = "WaitReportScaleInIsolateRanks"
SCALE_IN_RUNNING = "ScaleInRunning"
NOTIFY_DUMP = "NotifyDump"
WAIT_REPORT_DUMP_STATUS = "WaitReportDumpStatus"
CHECK_RECOVER_RESULT = "CheckRecoverResult"
FAULT_CLEAR = "FaultClear"
FAULT_RETRY = "FaultRetry"
KILL_JOB = "KillJob"
# -- O&M: NIC switch, stress test (omflows.py) ----------------------------------------------------
NOTIFY_PAUSE_TRAIN = "NotifyPauseTrain"
WAIT_REPORT_PAUSE_COMPLETE = "WaitReportPauseComplete"
NOTIFY_SWITCH_NIC = "NotifySwitchNic"
WAIT_SWITCH_NIC_FINISHED = "WaitSwitchNicFinished"
NOTIFY_STRESS_TEST = "NotifyStressTest"
WAIT_STRESS_TEST_FINISHED = "WaitStressTestFinished"
NOTIFY_CONTINUE_TRAIN = "NotifyContinueTrain"
WAIT_CONTINUE_TRAIN = "WaitContinueTrain"
# -- sub-health hot switch (hotswitch.py) ---------------------------------------------------------
NOTIFY_HOT_SWITCH = "NotifyHotSwitch"
WAIT_NEW_POD_RUNNING = "WaitNewPodRunning"
WAIT_OLD_POD_DELETED = "WaitOldPodDeleted"
NOTIFY_MIGRATION = "NotifyMigration"
WAIT_REPORT_MIGRATION_STATUS = "WaitReportMigrationStatus"

CHOOSE = frozenset({WAIT_RESOURCES, WAIT_RANK_TABLE_READY, NOTIFY_DECIDED_STRATEGY, NOTIFY_DUMP})
"""Where choosing a strategy leads: the elastic resource wait, platform mode's rank-table wait, the
``changeStrategy`` of the choice, or the dump."""

AFTER_FAILURE = frozenset({NOTIFY_DECIDED_STRATEGY, NOTIFY_DUMP})
"""Where choosing leads once recover, recover-in-place or elastic training failed: ``changeStrategy``
exit (or the forced scale-in), or the dump (:data:`clusterd.brain.strategy.AFTER_FAILURE`)."""

TRANSITIONS: dict[str, frozenset[str]] = {
    k: frozenset(v)
    for k, v in {
        # a flow starts: the recovery, an O&M operation (pause first), the hot switch
        INIT: {NOTIFY_WAIT_FAULT_FLUSHING, NOTIFY_PAUSE_TRAIN, NOTIFY_HOT_SWITCH},
        # fault recovery: stop training (platform mode asks the platform first; dump-only dumps)
        NOTIFY_WAIT_FAULT_FLUSHING: {WAIT_PLATFORM_STRATEGY, NOTIFY_STOP_TRAIN, NOTIFY_DUMP},
        WAIT_PLATFORM_STRATEGY: {NOTIFY_STOP_TRAIN, NOTIFY_DUMP, FAULT_CLEAR},
        NOTIFY_STOP_TRAIN: {WAIT_REPORT_STOP_COMPLETE, FAULT_CLEAR},
        WAIT_REPORT_STOP_COMPLETE: {WAIT_FAULT_FLUSH_FINISHED, KILL_JOB, FAULT_CLEAR},
        # the global fault (platform confirmation, recover-in-place split) and the strategy report
        WAIT_FAULT_FLUSH_FINISHED: {NOTIFY_GLOBAL_FAULT},
        NOTIFY_GLOBAL_FAULT: {
            WAIT_PLATFORM_RESULT_FAULT,
            WAIT_FAULT_DISAPPEAR,
            WAIT_REPORT_RECOVER_STRATEGY,
            KILL_JOB,
        },
        WAIT_PLATFORM_RESULT_FAULT: {
            NOTIFY_GLOBAL_FAULT,
            WAIT_FAULT_DISAPPEAR,
            WAIT_REPORT_RECOVER_STRATEGY,
            KILL_JOB,
            FAULT_CLEAR,
        },
        WAIT_FAULT_DISAPPEAR: {NOTIFY_GLOBAL_FAULT, WAIT_PLATFORM_RESULT_FAULT},
        # the hot switch shares the strategy report, then migrates
        WAIT_REPORT_RECOVER_STRATEGY: CHOOSE
        | {FAULT_CLEAR, NOTIFY_MIGRATION, WAIT_OLD_POD_DELETED, KILL_JOB},
        # choosing and running a strategy, with fallback
        WAIT_RESOURCES: CHOOSE - {WAIT_RESOURCES},
        WAIT_RANK_TABLE_READY: {NOTIFY_DECIDED_STRATEGY, NOTIFY_DUMP, FAULT_CLEAR},
        NOTIFY_DECIDED_STRATEGY: {
            CHECK_RECOVER_RESULT,
            WAIT_REPORT_STEP_RETRY_STATUS,
            WAIT_REPORT_PROCESS_RECOVER_STATUS,
            WAIT_REPORT_SCALE_IN_ISOLATE_RANKS,
            FAULT_CLEAR,
        },
        WAIT_REPORT_STEP_RETRY_STATUS: CHOOSE | {WAIT_FAULT_FLUSH_FINISHED, FAULT_CLEAR},  # 405: again
        # recover, recover-in-place and elastic training fall back to dump or exit only
        # (strategy.AFTER_FAILURE); a recover the pods are not rescheduled for in time scales in
        WAIT_REPORT_PROCESS_RECOVER_STATUS: AFTER_FAILURE | {FAULT_CLEAR},
        WAIT_REPORT_SCALE_IN_ISOLATE_RANKS: AFTER_FAILURE | {SCALE_IN_RUNNING, FAULT_CLEAR},
        SCALE_IN_RUNNING: AFTER_FAILURE | {NOTIFY_WAIT_FAULT_FLUSHING, FAULT_CLEAR},  # a new fault: again
        NOTIFY_DUMP: {WAIT_REPORT_DUMP_STATUS, FAULT_CLEAR},
        WAIT_REPORT_DUMP_STATUS: {CHECK_RECOVER_RESULT, FAULT_CLEAR},
        CHECK_RECOVER_RESULT: set(),
        # FaultClear / FaultRetry, killMaster: each ends the flow
        FAULT_CLEAR: {FAULT_RETRY},
        FAULT_RETRY: {KILL_JOB},
        KILL_JOB: set(),
        # O&M: pause, the operation, continue (a failed operation runs the recovery)
        NOTIFY_PAUSE_TRAIN: {WAIT_REPORT_PAUSE_COMPLETE, KILL_JOB},
        WAIT_REPORT_PAUSE_COMPLETE: {NOTIFY_SWITCH_NIC, NOTIFY_STRESS_TEST, KILL_JOB},
        NOTIFY_SWITCH_NIC: {WAIT_SWITCH_NIC_FINISHED, KILL_JOB},
        WAIT_SWITCH_NIC_FINISHED: {NOTIFY_WAIT_FAULT_FLUSHING, NOTIFY_CONTINUE_TRAIN},
        NOTIFY_STRESS_TEST: {WAIT_STRESS_TEST_FINISHED, KILL_JOB},
        WAIT_STRESS_TEST_FINISHED: {NOTIFY_WAIT_FAULT_FLUSHING, NOTIFY_CONTINUE_TRAIN},
        NOTIFY_CONTINUE_TRAIN: {WAIT_CONTINUE_TRAIN, KILL_JOB},
        WAIT_CONTINUE_TRAIN: {KILL_JOB},
        # sub-health hot switch
        NOTIFY_HOT_SWITCH: {WAIT_NEW_POD_RUNNING},
        WAIT_NEW_POD_RUNNING: {WAIT_REPORT_RECOVER_STRATEGY},
        WAIT_OLD_POD_DELETED: {NOTIFY_MIGRATION, KILL_JOB},  # Kubernetes: Volcano deletes the fault pod
        NOTIFY_MIGRATION: {WAIT_REPORT_MIGRATION_STATUS},
        WAIT_REPORT_MIGRATION_STATUS: {KILL_JOB},
    }.items()
}
"""state -> the states a flow may move to from it (besides itself and :data:`INIT`)."""

ILLEGAL: Counter[tuple[str, str]] = Counter()
"""(from, to) -> illegal moves seen in this process (module docstring)."""


def allowed(src: str, dst: str) -> bool:
    """True when a controller may move from ``src`` to ``dst`` (:data:`TRANSITIONS`; staying and
    going back to INIT always may)."""
    return dst == src or dst == INIT or dst in TRANSITIONS.get(src, ())


def check(job_id: str, src: str, dst: str) -> bool:
    """Judge the move ``src`` -> ``dst`` of ``job_id``'s controller. An illegal one is logged
    (``controller illegal transition``) and counted in :data:`ILLEGAL`; returns False then. Never raises."""
    if allowed(src, dst):
        return True
    ILLEGAL[(src, dst)] += 1
    event(log, logging.WARNING, "controller illegal transition", job=job_id, src=src, dst=dst)
    return False


class IllegalTransitions:
    """A Prometheus collector of :data:`ILLEGAL`: the counter
    ``faultmesh_brain_illegal_transitions_total{from,to}`` (register it on a registry)."""

    def collect(self):
        fam = CounterMetricFamily(
            "faultmesh_brain_illegal_transitions",
            "Recovery controller moves the state table does not allow",
            labels=["from", "to"],
        )
        for (src, dst), n in sorted(ILLEGAL.items()):
            fam.add_metric([src, dst], n)
        yield fam
