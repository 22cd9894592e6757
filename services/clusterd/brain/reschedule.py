"""Waiting for the fault pods to be rescheduled (clusterd.md §7.1, §7.3 steps 4-5 and "Strategy
choice"; the reference's listenScheduleResult, whetherHasEnoughResource, canChooseScaleInStrategy).

*Resources back* means, in Kubernetes mode (the controller's pod port, issue 32 item 4; the
reference's listenScheduleResult, ``podgroup.JudgeIsRunningByJobKey``): the job's PodGroup is
``Running`` and every pod told to exit was replaced (a Running pod of that rank with another UID
than at globalFault). Standalone, or a job without a PodGroup: the job is ``running`` and no rank
of the pods told to exit has an active UnHealthy fault any more (its ranks moved to healthy
devices by a job apply, or its fault cleared).

- ``wait-reschedule-timeout`` (job setting, 30..270 s, default 270; a PodGroup annotation in
  Kubernetes mode): while the training side recovers (``recover`` / ``recover-in-place`` with
  pods to restart), the fault pods must be back within it. Back -> decision
  ``reschedule-success`` (the reference clears the reset ConfigMap) and the status is still
  awaited; not back -> ``changeStrategy downgrade`` when elastic training is configured and
  reported (scale-in fallback), else FaultClear / FaultRetry.
- ``MINDIO_WAIT_MINDX_TIME`` (the rank-0 pod's env; job setting ``mindioWaitMindxTime``):
  elastic training with job or pod rescheduling configured first waits value - 10 s (values
  10..3600; otherwise 20 s) for the resources; back -> no scale-in (the job is rescheduled),
  else scale-in. MindIO gives up after the full value, so ClusterD decides 10 s earlier.

Both waits are multiplied by ``job_wait_scale`` (``--job-wait-scale``, 1 outside tests).
"""

from __future__ import annotations

import asyncio
import time

from clusterd.brain import states
from clusterd.brain.ctlcore import ControllerCore
from faultmesh.levels import UNHEALTHY, level_health

WAIT_RESCHEDULE_KEY = "wait-reschedule-timeout"
WAIT_RESCHEDULE_DEFAULT_S = 270
WAIT_RESCHEDULE_RANGE = (30, 270)
MINDIO_DIFFERENCE_S = 10
MINDIO_DEFAULT_WAIT_S = 20
MINDIO_MAX_S = 3600


def wait_reschedule_s(job) -> int:
    """The job's wait-reschedule-timeout in s: its PodGroup annotation (Kubernetes mode) or job
    setting when in 30..270, else 270 (the reference logs and uses the default)."""
    raw = job.extra.get(WAIT_RESCHEDULE_KEY, job.wait_reschedule_s)
    try:
        v = int(raw)
    except (TypeError, ValueError):
        return WAIT_RESCHEDULE_DEFAULT_S
    lo, hi = WAIT_RESCHEDULE_RANGE
    return v if lo <= v <= hi else WAIT_RESCHEDULE_DEFAULT_S


def resource_wait_s(job) -> int:
    """Elastic training's resource wait in s: MINDIO_WAIT_MINDX_TIME - 10 for values 10..3600, else 20."""
    v = job.mindio_wait_s
    if MINDIO_DIFFERENCE_S <= v <= MINDIO_MAX_S:
        return v - MINDIO_DIFFERENCE_S
    return MINDIO_DEFAULT_WAIT_S


class RescheduleSteps:
    """The rescheduling waits of the recovery flow (module docstring); ``c`` the controller core."""

    def __init__(self, c: ControllerCore) -> None:
        self.c = c
        self.st = c.st

    def exit_pod_ranks(self) -> set[int]:
        """Ranks of the fault pods that restart as pods (not those restarting processes in place)."""
        job = self.c.job()
        if job is None:
            return set()
        pods = {
            f.pod_rank for f in self.st.cached_faults.values() if f.pod_rank >= 0
        } - self.st.restart_proc_pods
        return {r.rank for node in job.nodes() if job.pod_rank(node) in pods for r in job.ranks_on(node)}

    def current_faults(self, cached) -> bool:
        """True while any rank of ``cached`` (rank, code) keys still has an active UnHealthy fault."""
        job = self.c.job()
        if job is None:
            return False
        ranks = {k[0] for k in cached}
        return any(
            f.rank in ranks and level_health(f.level) == UNHEALTHY for f in self.c.ports.rank_faults(job)
        )

    def note_fault_pods(self) -> None:
        """Kubernetes mode: remember the UIDs of the fault pods now (the pods told to exit)."""
        pods = self.c.ports.pods
        if pods is not None:
            fault_pods = {f.pod_rank for f in self.st.cached_faults.values() if f.pod_rank >= 0}
            now = pods.pod_uids(self.c.job_id)
            self.st.fault_pod_uids = {p: uid for p, uid in now.items() if p in fault_pods}

    def pods_replaced(self, pod_ranks: set[int]) -> bool | None:
        """Kubernetes mode: PodGroup Running and the pods ``pod_ranks`` replaced (module docstring).
        None standalone or without a PodGroup (the caller judges by fault health)."""
        pods = self.c.ports.pods
        if pods is None:
            return None
        old = {p: uid for p, uid in self.st.fault_pod_uids.items() if p in pod_ranks}
        return pods.resources_back(self.c.job_id, old)

    def resources_back(self) -> bool:
        """The exiting fault pods are back (module docstring)."""
        job = self.c.job()
        if job is None:
            return False
        pods = {
            f.pod_rank for f in self.st.cached_faults.values() if f.pod_rank >= 0
        } - self.st.restart_proc_pods
        kube = self.pods_replaced(pods)
        if kube is not None:
            return kube
        if job.status != "running":
            return False
        ranks = self.exit_pod_ranks()
        return not self.current_faults({(r, "") for r in ranks})

    def elastic_supported(self, job, reported) -> bool:
        """Elastic training configured, reported (``downgrade``) and pod rank 0 not faulty."""
        pod0 = any(f.pod_rank == 0 for f in self.st.cached_faults.values())
        return "elastic-training" in job.strategies() and "downgrade" in set(reported) and not pod0

    async def wait_resources(self, flow: str, job) -> bool:
        """whetherHasEnoughResource: wait up to MINDIO_WAIT_MINDX_TIME - 10 s for the resources.
        True when they came back (then no scale-in); records an ``elastic-wait`` decision."""
        wait = resource_wait_s(job)
        self.c.set_state(states.WAIT_RESOURCES)
        deadline = time.monotonic() + wait * self.c.t.job_wait_scale
        while not self.resources_back():
            if time.monotonic() >= deadline:
                self.c.decide(flow, "elastic-wait", f"fault pods not rescheduled within {wait}s: scale-in")
                return False
            await asyncio.sleep(min(self.c.t.poll_s, max(0.0, deadline - time.monotonic())))
        self.c.decide(flow, "elastic-wait", f"fault pods rescheduled within {wait}s: no scale-in")
        return True

    async def wait_status_rescheduled(self, strategy: str):
        """Wait for the strategy's ReportRecoverStatus (already expected) while watching the
        rescheduling (module docstring). Returns ("status", report), ("timeout", None) when no
        status came in ``report_s``, or ("reschedule-timeout", seconds)."""
        job = self.c.job()
        watch = (
            job is not None and strategy in ("recover", "recover-in-place") and bool(self.exit_pod_ranks())
        )
        wait = wait_reschedule_s(job) if job is not None else WAIT_RESCHEDULE_DEFAULT_S
        resched_deadline = (self.st.resched_started or time.monotonic()) + wait * self.c.t.job_wait_scale
        deadline = time.monotonic() + self.c.t.report_s
        while True:
            now = time.monotonic()
            if watch:
                if self.resources_back():
                    watch = False
                    self.c.decide(
                        "recovery",
                        "reschedule-success",
                        "fault pods rescheduled; waiting for the status",
                    )
                elif now >= resched_deadline:
                    return "reschedule-timeout", wait
            step = deadline - now
            if watch:
                step = min(step, self.c.t.poll_s, max(0.0, resched_deadline - now))
            r = await self.c.io.wait("status", timeout_s=max(0.0, step), keep=True)
            if r is not None:
                self.c.io.unexpect("status")
                return "status", r[1]
            if time.monotonic() >= deadline:
                self.c.io.unexpect("status")
                return "timeout", None
