"""The brain's fault intake (clusterd.md §7.2): new job faults -> the recovery controller.

One object, :class:`FaultIntake`, owned by :class:`clusterd.brain.component.BrainComponent` and built
with the narrow things it uses (issue 28: no mixin, nothing holds the brain): its own fault-center
subscription (``brain``), the job registry, the controllers lookup, the decision sink, the job's
rank-fault view, platform mode's annotations, the task spawner, the business-plane retry reports and
the ReportProcessFault listeners. Faults of a node come from the fault center's one by-node index
(:meth:`clusterd.faultindex.FaultIndex.faults_of_node`, through ``rank_faults``): the intake keeps
no index of its own.

Only (rank, code) pairs new since the last look act. Every new fault is cached on the controller (the
reference's saveCacheFault); then:

- a non-retry fault (or any fault when retry is not configured) -> ``preExitProcess`` to the fault
  pods; TaskD stops those workers and its ``ReportProcessFault`` starts the recovery
  (:meth:`FaultIntake.process_fault`);
- only step-retry faults (UCE "0" / HCCL "2") with retry configured -> the recovery starts at once
  (``stopTrain``);
- sub-health faults -> the job's subHealthyStrategy (hotSwitch / graceExit / ignore); graceExit
  sends ``preExitProcess`` and TaskD's ``ReportProcessFault`` starts the dump.

A job with process-level recovery on a graceful-tolerance node (:mod:`clusterd.brain.graceexcl`)
runs none of the process-level flows: its UnHealthy faults and TaskD's ReportProcessFault get the
decision ``job-rescheduling`` (the reference's user guide: the two features exclude each other and
such a job is recovered by Job-level rescheduling); its sub-health faults keep their strategy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from clusterd.brain.controller import INIT, Controller
from clusterd.brain.faultview import RECOVER_IGNORED_LEVELS, RankFault, job_health
from clusterd.brain.graceexcl import GraceExclusion
from clusterd.brain.graceexcl import reason as grace_reason
from clusterd.brain.jobs import Job, JobRegistry
from clusterd.brain.platform import STRATEGY_KEY
from clusterd.brain.ports import DecisionSink
from clusterd.brain.retryproc import CODE_OF_TYPE, RETRY_TYPES, RetryReports
from faultmesh.levels import SUB_HEALTHY, UNHEALTHY, level_health
from faultmesh.log import event
from faultmesh.model import Fault, now_ms

RETRY_FAULT, SOFTWARE_FAULT = "retry-fault", "software"
"""The fault reasons of a ReportProcessFault (the reference's ``fault-type`` pod label values)."""

log = logging.getLogger("clusterd.brain")

HOT_SWITCH_FRAMEWORKS = ("pytorch", "mindspore")
MAX_HOT_SWITCH_PODS = 10

ReportListener = Callable[[str, list[RankFault], str], None]
"""``(job id, rank faults, reason)``: told of each ReportProcessFault with known ranks; must not wait."""


class FaultIntake:
    """The brain's fault intake (module docstring).

    - ``subscribe(name, publish, resync=...)``: the fault center's subscription
      (:meth:`clusterd.center.FaultCenter.subscribe`); the intake takes its own, ``brain``, at once;
    - ``jobs``: the job registry (jobs on a node, ``update`` a job's sub-health strategy);
    - ``controller_of(job_id)``: the job's recovery controller, None while not registered
      (:meth:`clusterd.brain.registry.RecoveryRegistry.get`);
    - ``decide``: the decision sink; ``rank_faults(job)``: the job's rank faults now, every filter
      applied; ``platform(job_id)``: the job's platform-mode annotations;
    - ``spawn(coro, name)``: a task owned by ClusterD; ``retry_reports``: the business-plane retry
      reports; ``report_listeners``: told of each ReportProcessFault (:data:`ReportListener`);
    - ``exclusion``: which jobs graceful tolerance sends to Job-level rescheduling (None: none).
    """

    def __init__(
        self,
        subscribe: Callable[..., Any],
        jobs: JobRegistry,
        controller_of: Callable[[str], Controller | None],
        decide: DecisionSink,
        rank_faults: Callable[[Job], list[RankFault]],
        platform: Callable[[str], dict[str, str]],
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task],
        retry_reports: RetryReports,
        report_listeners: list[ReportListener],
        exclusion: GraceExclusion | None = None,
    ) -> None:
        self.jobs = jobs
        self.controller_of = controller_of
        self.decide = decide
        self.rank_faults = rank_faults
        self.platform = platform
        self.spawn = spawn
        self.retry_reports = retry_reports
        self.report_listeners = report_listeners
        self.exclusion = exclusion or GraceExclusion(lambda node: False)
        self._unregistered_seen: dict[str, set[tuple[int, str]]] = {}  # job -> last look, no controller
        subscribe("brain", self._on_fault_changes, resync=self._resync)

    def forget(self, job_id: str) -> None:
        """A deleted job: drop what the intake remembers of it (its last look while unregistered)."""
        self._unregistered_seen.pop(job_id, None)
        self.exclusion.forget(job_id)

    # -- the fault center's subscription -----------------------------------------------------------
    def _resync(self, faults: list[Fault]) -> None:
        """The subscription fell behind: evaluate every job (new (rank, code) pairs still act once)."""
        self.evaluate_each(self.jobs.all())

    def _on_fault_changes(self, changes) -> None:
        nodes = {c.fault.node for c in changes}
        self.evaluate_each({j.id: j for n in nodes for j in self.jobs.jobs_on_node(n)}.values())

    def evaluate_each(self, jobs) -> None:
        """:meth:`evaluate` each job; a failure is logged (``job fault evaluation failed``), the rest go on."""
        for job in list(jobs):
            try:
                self.evaluate(job)
            except Exception as e:
                event(log, logging.ERROR, "job fault evaluation failed", job=job.id, error=repr(e))

    def evaluate(self, job) -> None:
        """Act on new faults of ``job`` (§7.2): recovery for UnHealthy, the sub-health strategy for
        SubHealthy; only (rank, code) pairs new since the last look act."""
        faults = [f for f in self.rank_faults(job) if f.level not in RECOVER_IGNORED_LEVELS]
        health = job_health(faults)
        keys = {(f.rank, f.code) for f in faults}
        ctl = self.controller_of(job.id)
        grace = self.exclusion.node_of(job)
        if ctl is None:
            seen = self._unregistered_seen.get(job.id, set())
            self._unregistered_seen[job.id] = keys
            new = [f for f in faults if (f.rank, f.code) not in seen and level_health(f.level) == UNHEALTHY]
            if new and grace:
                self.decide(job.id, "recovery", "job-rescheduling", grace_reason(grace), faults=new)
            elif new:  # a sub-health fault (a slow-node confirmation) on an UnHealthy job decides nothing
                resched = job.rescheduling()
                self.decide(
                    job.id,
                    "recovery",
                    resched[0] if resched else "none",
                    "no process-recovery client registered; "
                    + (
                        "the job is rescheduled away from the fault"
                        if resched
                        else "no rescheduling configured"
                    ),
                    faults=new,
                )
            return
        new = [f for f in faults if (f.rank, f.code) not in ctl.st.seen_fault_keys]
        ctl.st.seen_fault_keys = keys
        if not new:
            return
        if health == UNHEALTHY:
            joined = [f for f in new if f.level != "SubHealthFault"]
            if not joined:
                return
            if grace:  # no process-level flow: Job-level rescheduling (module docstring)
                self.decide(job.id, "recovery", "job-rescheduling", grace_reason(grace), faults=joined)
                return
            only_retry = all(f.fault_type in ("0", "2") for f in joined)
            # supportRetryStrategy: in platform mode only while the platform said retry, which an
            # idle controller has not heard yet -> preExitProcess
            platform = STRATEGY_KEY in self.platform(job.id)
            pre_exit = "retry" not in job.strategies() or not only_retry or platform
            ctl.st.add_faults(joined)  # the reference's saveCacheFault: every new fault is cached
            if ctl.busy():
                event(log, logging.INFO, "fault joins the running flow", job=job.id, flow=ctl.st.flow_name)
                normal = [f for f in joined if f.fault_type == "1" and f.pod_rank >= 0]
                if normal and ctl.st.flow_name == "recovery":
                    # §7.2: the training side may exit the new fault pods at once (all ranks type "1")
                    self.spawn(ctl.recovery.pre_exit(normal, self.jobs), f"pre-exit-{job.id}")
                return
            if pre_exit and any(f.pod_rank >= 0 for f in joined):
                # §7.2: the reference does not stop the job itself: preExitProcess tells TaskD to stop
                # the fault ranks' workers; TaskD's ReportProcessFault then starts the recovery.
                self.spawn(
                    ctl.recovery.pre_exit(
                        joined,
                        self.jobs,
                        "hardware fault on the job's ranks; waiting for TaskD's ReportProcessFault",
                    ),
                    f"pre-exit-{job.id}",
                )
                return
            # only the joined faults: a sub-health rank (a slow-node confirmation) is no stop-train rank
            self.decide(job.id, "recovery", "stop-train", "hardware fault on the job's ranks", faults=joined)
            ctl.start_flow("recovery", lambda: ctl.recovery.run("fault"))
            return
        if health == SUB_HEALTHY:
            self._sub_health(job, ctl, [f for f in new if f.level == "SubHealthFault"])

    def _sub_health(self, job, ctl: Controller, faults: list[RankFault]) -> None:
        if not faults:
            return
        s = job.sub_healthy_strategy or "ignore"
        if s == "hotSwitch":
            why, degrade, faults = self._hot_switch_faults(job, ctl, faults)
            if why:
                self.decide(job.id, "hot-switch", "ignore", why, faults=faults)
                if degrade:
                    self.spawn(
                        self.jobs.update(job.id, hold=True, sub_healthy_strategy="ignore"),
                        f"degrade-{job.id}",
                    )
                return
            self.decide(
                job.id, "hot-switch", "start", "sub-health fault, subHealthyStrategy=hotSwitch", faults=faults
            )
            ctl.start_flow("hot-switch", lambda: ctl.hot_switch.run(faults))
        elif s == "graceExit":
            if [x for x in job.strategies() if x != "exit"] != ["dump"]:
                # the reference's skipHandleSubHealthyFaults: graceExit acts only for dump-only jobs
                self.decide(
                    job.id, "grace-exit", "ignore", "subHealthyStrategy=graceExit needs dump as the only strategy",
                    faults=faults,
                )  # fmt: skip
                return
            if ctl.busy() and ctl.st.flow_name != "recovery":
                self.decide(job.id, "grace-exit", "ignore", f"controller busy ({ctl.state})", faults=faults)
                return
            # notifyFaultInfoForJob -> sendPreExitSignal: TaskD stops the fault rank's workers; its
            # ReportProcessFault starts the recovery, which dumps (shouldDumpWhenOccurFault: dump only)
            ctl.st.add_faults(faults)
            why = (
                "sub-health fault, subHealthyStrategy=graceExit: the dump follows TaskD's ReportProcessFault"
            )
            self.spawn(ctl.recovery.pre_exit(faults, self.jobs, why), f"pre-exit-{job.id}")
        else:
            self.decide(
                job.id, "sub-health", "ignore", "subHealthyStrategy=ignore: training continues", faults=faults
            )

    @staticmethod
    def _hot_switch_faults(job, ctl: Controller, faults: list[RankFault]):
        """The reference's skipHandleSubHealthyHotSwitch: (why not, degrade to ignore, the faults to
        switch). A framework without hot switch or more than ``MAX_HOT_SWITCH_PODS`` fault pods
        degrades the job's subHealthyStrategy; a busy controller or faults only on the master pod
        (pod rank 0, whose faults are left out) skip this fault and keep the strategy. Only the first
        fault pod (lowest pod rank) is switched."""
        if job.framework not in HOT_SWITCH_FRAMEWORKS:
            return f"framework {job.framework} does not support hot switch", True, faults
        if ctl.busy() or ctl.state != INIT:
            return f"controller busy ({ctl.state})", False, faults
        others = [f for f in faults if f.pod_rank > 0]
        if not others:
            return "the fault is on the master pod (pod rank 0)", False, faults
        pods = {f.pod_rank for f in others}
        if len(pods) > MAX_HOT_SWITCH_PODS:
            return f"more than {MAX_HOT_SWITCH_PODS} fault pods", True, faults
        return None, False, [f for f in others if f.pod_rank == min(pods)]

    async def process_fault(self, job_id: str, ranks) -> None:
        """ReportProcessFault: ranks with a type "1" start a recovery flow (``stopTrain``); when every
        rank is a retry type ("0" / "2") they become business-plane retry reports instead
        (:mod:`clusterd.brain.retryproc`). Unknown ranks are skipped."""
        ctl = self.controller_of(job_id)
        job = self.jobs.get(job_id)
        if ctl is None or job is None:
            return
        now = now_ms()
        faults = []
        for fr in ranks:
            r = next((x for x in job.ranks if str(x.rank) == fr.rankId), None)
            if r is None:
                continue
            level = "RestartBusiness"
            faults.append(
                RankFault(
                    r.rank, r.node, r.device_id, job.pod_rank(r.node), "", level, fr.faultType or "1", now
                )
            )
        if not faults:
            return
        if grace := self.exclusion.node_of(job):  # no process-level flow: Job-level rescheduling
            self.decide(job_id, "recovery", "job-rescheduling", grace_reason(grace), faults=faults)
            return
        ctl.st.add_faults(faults, new_ranks_only=True)  # ranks the hardware intake cached keep their fault
        # the reference labels the reported ranks' pods here (LabelFaultPod), "retry-fault" when every
        # cached fault is a retry type, else "software" (fault_recover_service.go getFaultReason)
        reason = RETRY_FAULT if all(f.fault_type in RETRY_TYPES for f in ctl.st.faults()) else SOFTWARE_FAULT
        for fn in self.report_listeners:
            fn(job_id, faults, reason)
        if all(f.fault_type in RETRY_TYPES for f in faults):
            # the reference: retry-type ranks go to the fault centre's retry processor (business-plane
            # retry reports), not to a new flow; their synthetic fault ranks come back through the
            # hardware intake (retry configured -> stopTrain, else preExitProcess)
            for f in faults:
                self.retry_reports.report(job_id, f.rank, f.fault_type, now)
                ctl.st.seen_fault_keys.discard((f.rank, CODE_OF_TYPE[f.fault_type]))
            event(log, logging.INFO, "retry report", job=job_id, ranks=",".join(str(f.rank) for f in faults))
            self.evaluate(job)
            return
        if ctl.busy():
            return
        self.decide(
            job_id, "recovery", "stop-train", "the training side reported a process fault",
            faults=ctl.st.faults(),
        )  # fmt: skip
        ctl.start_flow("recovery", lambda: ctl.recovery.run("process-fault"))
