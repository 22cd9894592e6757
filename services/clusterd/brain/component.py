"""The brain component: jobs, recovery decisions and the upstream Recover / Fault / Job / Config /
TrainingDataTrace services inside ClusterD (issue 7; clusterd.md §2-4, §6.4, §7).

Built with the cluster context only. Its peers for other components, handed over by
:mod:`clusterd.app`: ``jobs`` (:class:`~clusterd.brain.jobs.JobRegistry`: resolve a job's ranks ->
(node, device)) and ``set_data_trace("ns/name", {"CommunicationOperator": "on", ...})`` (FD-OL's
hook). It owns the fault intake (:class:`~clusterd.brain.intake.FaultIntake`, a composed object
with its own fault-center subscription ``brain``: own queue and task, resync = re-evaluate every
job), which turns new job faults into the controllers' flows.

HTTP:

- ``GET /v1/jobs`` — every job with health, fault count, recovery state;
- ``POST /v1/jobs`` — apply jobs (JSON body: one job, a list or ``{"jobs": [...]}``; YAML text too);
  400 with the reason on a bad spec; bearer token when ClusterD has one (:mod:`clusterd.auth`);
- ``GET /v1/jobs/<id>`` — one job with its rank faults and fault view; ``DELETE`` removes it;
- ``GET /v1/jobs/<id>/recovery`` — controller state and the decisions with their reasons.

Decisions (``recovery decision`` log lines) are kept per job (last 200) in the state file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from clusterd.brain import customfilter, mindie
from clusterd.brain.controller import Controller, timeouts_from
from clusterd.brain.datatrace import DataTrace, DataTraceError
from clusterd.brain.decisions import DecisionLog
from clusterd.brain.faultsvc import FaultServicer
from clusterd.brain.faultview import (
    STRESS_HIDDEN_CODES,
    RankFault,
    job_health,
    job_rank_faults,
)
from clusterd.brain.graceexcl import GraceExclusion
from clusterd.brain.http import JobsHttp
from clusterd.brain.intake import FaultIntake, ReportListener
from clusterd.brain.jobs import JobRegistry
from clusterd.brain.jobsvc import ConfigServicer, JobServicer
from clusterd.brain.platform import PlatformAnnotations
from clusterd.brain.ports import ControllerPorts, PodsPort
from clusterd.brain.recover import RecoverServicer
from clusterd.brain.registry import RecoveryRegistry
from clusterd.brain.retryproc import RetryReports
from clusterd.brain.states import IllegalTransitions
from faultmesh._pb import (
    agent_pb2,
    config_pb2_grpc,
    fault_pb2_grpc,
    job_pb2_grpc,
    profiling_pb2_grpc,
    recover_pb2_grpc,
)
from faultmesh.exclusions import grace_mode
from faultmesh.log import event
from faultmesh.model import Fault, now_ms

if TYPE_CHECKING:
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.brain")

ISOLATE_SOURCE = "brain:stress-test"
ISOLATE_CODE = "StressTestIsolate"


class BrainComponent:
    """See the module docstring."""

    name = "brain"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("brain (jobs and recovery)")
        g.add_argument(
            "--report-timeout-s", type=float, default=900.0, help="wait for each client report (s)"
        )
        g.add_argument("--keepalive-s", type=float, default=5.0, help="keep-alive signal period (s)")
        g.add_argument("--fault-flush-s", type=float, default=1.0, help="WaitFaultFlushFinished sleep (s)")
        g.add_argument("--hot-switch-wait-s", type=float, default=60.0, help="wait for a backup pod (s)")
        g.add_argument(
            "--scale-wait-s", type=float, default=270.0, help="elastic training: resources back (s)"
        )
        g.add_argument("--signal-send-s", type=float, default=5.0, help="a signal must reach its stream (s)")
        g.add_argument(
            "--command-gap-s",
            type=float,
            default=1.0,
            help="least time between two signals with no client report between (TaskD's 1 s tick; s)",
        )
        g.add_argument(
            "--fault-retry-s", type=float, default=65.0, help="FaultRetry: wait for the job to run again (s)"
        )
        g.add_argument(
            "--hccl-route-s",
            type=float,
            default=3.0,
            help="a retry with HCCL ranks: route convergence wait (s)",
        )
        g.add_argument(
            "--in-place-wait-s",
            type=float,
            default=15.0,
            help="recover-in-place: wait for the fault pods' faults to vanish (s)",
        )
        g.add_argument(
            "--pre-exit-wait-s", type=float, default=10.0, help="idle job: preExit waits for a flow (s)"
        )
        g.add_argument(
            "--platform-wait-s",
            type=float,
            default=300.0,
            help="platform mode: each wait for the AI platform (s)",
        )
        g.add_argument(
            "--retry-hide-s",
            type=float,
            default=10.0,
            help="retry filter: a new UCE/HCCL retry fault on a retry job stays hidden this long, "
            "for the business plane's report (s)",
        )
        g.add_argument(
            "--retry-complete-window-s",
            type=float,
            default=30.0,
            help="retry filter: after a business-plane report the fault stays hidden this long (s)",
        )
        g.add_argument(
            "--job-wait-scale",
            type=float,
            default=1.0,
            help="multiplies the job's own waits (wait-reschedule-timeout, MINDIO_WAIT_MINDX_TIME; tests only)",
        )
        g.add_argument(
            "--data-trace-dir",
            default=None,
            help="host folder of <ns>.data-trace-<job>/profilingSwitch files "
            "(default <state-dir>/datatrace-config; the reference uses /user/cluster-info/datatrace-config)",
        )

    def __init__(
        self,
        ctx: ClusterContext,
        jobs: JobRegistry,
        decisions: DecisionLog,
        report_listeners: list[ReportListener],
        platform_backend: Any = None,
        pods: PodsPort | None = None,
    ) -> None:
        """``jobs``, ``decisions``: built by the wiring (Kubernetes subscribes before the brain exists);
        ``report_listeners(job id, rank faults, reason)``: each ReportProcessFault with known ranks, must
        not wait; ``platform_backend``: platform mode's annotations on PodGroups (None: the store);
        ``pods``: Kubernetes mode's pod port (:class:`~clusterd.brain.ports.PodsPort`; None standalone)."""
        self.ctx = ctx
        a = ctx.config
        reg = ctx.metrics.registry
        self.timeouts = timeouts_from(a)
        self.jobs = jobs
        self.registry = RecoveryRegistry(ctx.store, self.jobs, self._new_controller)
        self.decision_log = decisions
        self.decisions = self.decision_log.decisions
        self._sent_nodes: dict[str, set[str]] = {}  # job -> nodes that got its JobInfo
        self.retry_reports = RetryReports(  # business-plane retry reports (the retry processor)
            hide_ms=int(a.retry_hide_s * 1000), complete_ms=int(a.retry_complete_window_s * 1000)
        )
        self._rechecks: dict[str, asyncio.TimerHandle] = {}  # job -> re-evaluation when a hide ends
        self.platform = PlatformAnnotations(ctx.store, ctx.tasks.spawn, platform_backend)
        self.decision_log.subscribe(self.platform.on_decision, "decisions-platform")
        self.m_signals = Counter("faultmesh_brain_signals_total", "ProcessManageSignals delivered by type",
                                 ["signal"], registry=reg)  # fmt: skip
        reg.register(IllegalTransitions())  # faultmesh_brain_illegal_transitions_total{from,to}
        Gauge("faultmesh_brain_jobs", "Jobs in the registry", registry=reg).set_function(
            lambda: len(self.jobs)
        )
        Gauge("faultmesh_brain_registered_jobs", "Jobs with a Recover client", registry=reg).set_function(
            lambda: len(self.controllers)
        )
        Gauge("faultmesh_brain_busy_jobs", "Jobs whose controller runs a flow", registry=reg).set_function(
            lambda: sum(1 for c in self.controllers.values() if c.busy())
        )
        self.ports = ControllerPorts(  # what every controller gets of the outside
            jobs=self.jobs, decide=self.decide, rank_faults=self.rank_faults,
            faults_of_node=self.faults_of_node, isolate_nodes=self.isolate_nodes, platform=self.platform,
            spawn=self.spawn, count_rejected=self.count_rejected,
            count_signal=lambda signal_type: self.m_signals.labels(signal_type).inc(), pods=pods,
        )  # fmt: skip
        self.fault = FaultServicer(
            self.jobs, ctx.center, ctx.nodes.info, self.hidden_nodes, self.count_rejected
        )  # subscribes to the fault center and the job registry itself
        self.intake = FaultIntake(  # new job faults -> the controllers; its own subscription ("brain")
            ctx.center.subscribe, self.jobs, self.registry.get, self.decide, self.rank_faults,
            self.platform.get, self.spawn, self.retry_reports, report_listeners,
            GraceExclusion(lambda node: ctx.nodes.labelled(node, grace_mode), reg),
        )  # fmt: skip
        self.recover = RecoverServicer(
            self.jobs, self.registry, self.decide, self.intake.process_fault, self.super_pod_id,
            self.count_rejected, self.timeouts.report_s,
        )  # fmt: skip
        self.job_svc = JobServicer(self.jobs, ctx.nodes.info, self.count_rejected)
        self.config_svc = ConfigServicer(self.jobs, ctx.nodes.info, self.spawn, self.count_rejected)
        self.datatrace = DataTrace(
            self.jobs, ctx.store, ctx.agents.send, self.count_rejected,
            a.data_trace_dir or f"{a.state_dir}/datatrace-config",
        )  # fmt: skip
        ctx.agents.on_connect(self._on_agent_connect)
        ctx.agents.on_connect(self.datatrace.on_agent_connect)
        self.jobs.listen(self._on_job_change)
        self.jobs_http = JobsHttp(  # the job routes; the web's job page reads its detail and recovery
            self.jobs, self.registry, self.decision_log, self.platform, self.job_view, self.decide,
            self.intake.evaluate, self.count_rejected,
        )  # fmt: skip
        self.jobs_http.add_routes(ctx.http.app.router)

    def servicers(self) -> list[tuple[Any, Any]]:
        """(add_to_server, servicer) pairs: Recover, Fault, Job, Config, TrainingDataTrace."""
        return [
            (recover_pb2_grpc.add_RecoverServicer_to_server, self.recover),
            (fault_pb2_grpc.add_FaultServicer_to_server, self.fault),
            (job_pb2_grpc.add_JobServicer_to_server, self.job_svc),
            (config_pb2_grpc.add_ConfigServicer_to_server, self.config_svc),
            (profiling_pb2_grpc.add_TrainingDataTraceServicer_to_server, self.datatrace),
        ]

    # the registry's, as the gauges, views and tests read them
    controllers = property(lambda self: self.registry.controllers)
    initialised = property(lambda self: self.registry.initialised)

    async def start(self) -> None:
        n = await self.jobs.load()
        await self.registry.load()  # Init survives a restart, of jobs still known
        await self.decision_log.load()
        self.decision_log.start()
        await self.platform.load()
        event(log, logging.INFO, "brain started", jobs=n)

    async def stop(self) -> None:
        for h in self._rechecks.values():
            h.cancel()
        self._rechecks.clear()
        await self.registry.close()
        await self.decision_log.close(5.0)  # the last decisions are kept and handed on

    # -- helpers used by controllers and servicers --------------------------------------------------
    def spawn(self, coro, name: str) -> asyncio.Task:
        """Run ``coro`` as a task owned by ClusterD (cancelled on shutdown)."""
        return self.ctx.tasks.spawn(coro, name=name)

    def count_rejected(self, reason: str) -> None:
        """Count a rejected request or dropped report (faultmesh_rejected_requests_total{service=brain})."""
        self.ctx.metrics.reject("brain", reason)

    def decide(self, job_id: str, flow: str, decision: str, reason: str, faults=None, **extra: Any) -> dict:
        """Record one decision (:class:`~clusterd.brain.decisions.DecisionLog`). Returns the record."""
        ctl = self.controllers.get(job_id)
        return self.decision_log.record(
            job_id, flow, decision, reason, ctl.state if ctl else "", faults=faults, **extra
        )

    def rank_faults(self, job) -> list[RankFault]:
        """The job's rank faults now (stress-test hidden codes removed, the retry filter applied),
        plus the synthetic ranks of business-plane retry reports (:mod:`clusterd.brain.retryproc`).
        A fault the retry filter hides has the job evaluated again when its hide ends."""
        ctl = self.controllers.get(job.id)
        hidden_nodes = ctl.st.hidden_nodes if ctl else set()
        now = now_ms()
        filt = customfilter.windows(
            job, customfilter.needs_subscription(job) and self.mindie_controller_subscribed(job)
        )
        ends: list[int] = []  # when faults the custom filter hides come back

        def hidden(node: str, f: Fault) -> bool:
            if node in hidden_nodes and f.code in STRESS_HIDDEN_CODES:
                return True
            until = customfilter.hidden_until(f, filt, now) if filt is not None else None
            if until is not None:
                ends.append(until)
            return until is not None

        out = job_rank_faults(job, self.faults_of_node, hidden)
        out, until = self.retry_reports.filter(job, out, now)
        if until is not None:
            ends.append(until)
        if ends:
            self._recheck_at(job.id, min(ends), now)
        extra = self.retry_reports.synthetic(job, out, now)
        return sorted(out + extra, key=lambda f: (f.rank, f.code)) if extra else out

    def mindie_controller_subscribed(self, job) -> bool:
        """True when the controller of ``job``'s MindIE service is registered with the Fault service:
        jobId the service's id (the pods' ``jobID`` label), role ``mindie-ms-controller`` (reference
        custom processor: ``IsSubscribed(MultiInstanceJobId, ControllerAppType)``); another role or
        a registration under one of the service's job ids does not count."""
        mid = job.mindie_job_id
        return bool(mid) and self.fault.subscribed(mid, mindie.CONTROLLER)

    def hidden_nodes(self, job_id: str) -> set[str]:
        """The nodes whose stress-test codes the job's views hide (its controller's, while one runs)."""
        ctl = self.controllers.get(job_id)
        return ctl.st.hidden_nodes if ctl else set()

    def _recheck_at(self, job_id: str, at_ms: int, now: int) -> None:
        """Evaluate ``job_id`` again at ``at_ms`` (one timer per job, the earliest wins)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing to schedule
            return
        old = self._rechecks.get(job_id)
        when = loop.time() + max(0, at_ms - now) / 1000 + 0.01
        if old is not None and not old.cancelled() and old.when() <= when:
            return
        if old is not None:
            old.cancel()
        self._rechecks[job_id] = loop.call_at(when, self._recheck, job_id)

    def _recheck(self, job_id: str) -> None:
        self._rechecks.pop(job_id, None)
        job = self.jobs.get(job_id)
        if job is not None:
            self.intake.evaluate_each([job])

    def faults_of_node(self, node: str) -> list[Fault]:
        """Active faults of ``node`` (the fault center's node index; O(faults on node))."""
        return self.ctx.center.faults_of_node(node)

    def super_pod_id(self, job, node: str) -> int:
        """SuperPoD id of ``node``: the job spec's ``superPodId``, else deviced's device state, else -1."""
        for r in job.ranks_on(node):
            if r.super_pod_id >= 0:
                return r.super_pod_id
        st = self.ctx.nodes.get(node)
        ids = [d.get("super_pod_id", -1) for d in st.devices.values()] if st else []
        return max(ids) if ids else -1

    async def isolate_nodes(self, job_id: str, nodes: list[str]) -> None:
        """Mark nodes UnHealthy after a stress test found a fault (code "2"): a SeparateFault node
        fault in the fault center (source ``brain:stress-test``)."""
        ups = [
            Fault(
                source=ISOLATE_SOURCE,
                node=n,
                device_type="Node",
                device_id=-1,
                code=ISOLATE_CODE,
                level="SeparateFault",
                attributes={"job": job_id, "NodeHealthyStatus": "UnHealthy"},
            )
            for n in nodes
        ]
        await self.ctx.center.apply(ups, [], ISOLATE_SOURCE)

    def _new_controller(self, job_id: str) -> Controller:
        """A registered job's controller: the faults it already has count as seen."""
        ctl = Controller(self.ports, job_id, self.timeouts)
        job = self.jobs.get(job_id)
        if job is not None:
            ctl.st.seen_fault_keys = {(f.rank, f.code) for f in self.rank_faults(job)}
        event(log, logging.INFO, "recover client registered", job=job_id)
        return ctl

    async def set_data_trace(self, job_ns_name: str, switch: dict[str, str]) -> None:
        """Set a job's data-trace switch (FD-OL's hook). Raises :class:`DataTraceError` (300 bad
        name, 500 unknown job); a file write failure is a ``DataTraceWriteError``, also an ``OSError``."""
        await self.datatrace.set_switch(job_ns_name, switch)

    # -- job changes -------------------------------------------------------------------------------
    async def _on_job_change(self, job, deleted: bool) -> None:
        old_nodes = self._sent_nodes.get(job.id, set())
        nodes = set() if deleted else set(job.nodes())
        gone = sorted(old_nodes - nodes)
        info = self._job_info(job, deleted=True) if gone else None
        for node in gone:
            await self.ctx.agents.send(node, "deviced", job=info)
        info = self._job_info(job) if nodes else None  # one message for every node of the job
        for node in sorted(nodes):
            await self.ctx.agents.send(node, "deviced", job=info)
        if deleted:
            self._sent_nodes.pop(job.id, None)
        else:
            self._sent_nodes[job.id] = nodes
        self.job_svc.broadcast(job, "delete" if deleted else "add")  # the reference: add / delete only
        self.config_svc.publish(job)  # a MindIE member changed or left: its global rank table
        if deleted:  # an Init is kept (the reference's initJob): Register then answers 402
            self.retry_reports.drop(job.id)
            self.platform.drop(job.id)
            self.intake.forget(job.id)
            await self.registry.drop(job.id)
        else:
            self.intake.evaluate(job)

    def _job_info(self, job, deleted: bool = False) -> agent_pb2.JobInfo:
        return agent_pb2.JobInfo(
            job_id=job.id,
            name=job.name,
            namespace=job.namespace,
            ranks=[
                agent_pb2.RankPlacement(rank=r.rank, node=r.node, device_id=r.device_id) for r in job.ranks
            ],
            deleted=deleted,
            process_recover_enable=job.process_recover_enable,  # deviced: no grace episode with
            recover_strategy=job.recover_strategy,  # process-level recovery (faultmesh.exclusions)
        )

    async def _on_agent_connect(self, node: str, agent: str) -> None:
        if agent != "deviced":
            return
        for job in self.jobs.jobs_on_node(node):
            await self.ctx.agents.send(node, "deviced", job=self._job_info(job))
            self._sent_nodes.setdefault(job.id, set()).add(node)

    def job_view(self, job, detail: bool = False) -> dict:
        """A job as JSON with health, faults and recovery state."""
        faults = self.rank_faults(job)
        ctl = self.controllers.get(job.id)
        d = job.to_dict()
        d.update(
            health=job_health(faults),
            fault_count=len(faults),
            registered=ctl is not None,
            initialised=job.id in self.initialised,
            state=ctl.state if ctl else "",
            strategies=job.strategies(),
        )
        if detail:
            d["faults"] = [f.as_dict() for f in faults]
            d["node_faults"] = self.fault.job_nodes(job)
            d["rank_table"] = job.rank_table()
        return d


__all__ = ["BrainComponent", "DataTraceError"]
