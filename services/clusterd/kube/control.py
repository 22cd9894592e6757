"""Kubernetes mode, the control ConfigMaps the reference's docs tell operators to ``kubectl apply``,
and ``fault-job-info`` (issue 15; reference fdol.md §3, §7; clusterd.md §3, §7.3; noded.md §8).

- ``ras-feature-slownode-<job>`` (``--kube-slownode-namespace``): watched here, applied by slow-node
  detection's Kubernetes part (:mod:`clusterd.slownode.kube`); one that waits for its job is kept
  in ``pending`` and tried again with the others (:meth:`ControlMaps.retry_pending`).
- ``data-trace-<job>`` (label ``reset=true``, the job's namespace; key ``profilingSwitch`` = JSON
  ``{"CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader"}``): each new version
  sets the job's switch through the brain's TrainingDataTrace (the same effect as the gRPC
  ``ModifyTrainingDataTraceSwitch``: state, the switch file, subscribers, the job's nodes); an
  omitted field becomes "". A version already applied (its text, kept in the store) is not
  applied again after a restart, so a later gRPC change is not undone. A deleted ConfigMap
  changes nothing. clusterd itself writes it on every switch change and deletes it with the job
  (:mod:`clusterd.kube.datatracecm`, while leading); a version equal to what it holds is skipped
  (the echo guard).
- ``fault-job-info`` (``--kube-fault-job-info-namespace``, cluster-system), written as the reference's
  ClusterD does for the A3 forced release (NodeD releases the fault super-devices' resources):
  key = job id, value = Go JSON of ``{"<superPodId>": {"SdIds": [..], "FaultNodes": {"<node>":
  {}}, "NodeNames": [the job's other nodes in that super pod], "FaultTimes": <unix s>, "JobId":
  ".."}}``; written on a fault decision (``stop-train`` / ``pre-exit``) when every node of the job
  is in a known super pod (topology: :func:`clusterd.kube.faultjobinfo.slownet_topology`), removed on ``recover-success``
  (after ``release_s``, the reference's 10 s), when the job is deleted, and hourly for jobs no
  longer known.

Bad input (truncated JSON, unknown keys, values over 64 KiB, wrong types) is refused with a logged,
counted reason (``faultmesh_rejected_requests_total{service="kube",reason}``, reasons
``datatrace_*``, :class:`clusterd.kube.cmchecks.ConfigMapChecks`); nothing else changes.

Deliberate difference: fault-job-info is written at the fault decision (the reference writes it
in NotifyGlobalFault, a few seconds later).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import orjson

from clusterd.brain.datatrace import DataTraceError
from clusterd.kube.cmchecks import ConfigMapChecks, configmap_name
from clusterd.kube.datatracecm import DataTraceConfigMaps
from clusterd.kube.faultjobinfo import Topology, fault_job_info, go_json
from clusterd.slownode.kube import SlowNodeConfigMaps
from faultmesh.kube import KubeApi, KubeError
from faultmesh.kubewatch import Handler, ListWatcher
from faultmesh.log import event
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.kube")

DATATRACE_LABEL = ("reset", "true")
DATATRACE_PREFIX = "data-trace-"
SWITCH_KEY = "profilingSwitch"
SWITCH_FIELDS = ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader")
FAULT_JOB_INFO = "fault-job-info"
STORE_NS = "kube.control"
WRITE_DECISIONS = frozenset({"stop-train", "pre-exit"})
REFRESH_S = 3600.0  # the reference refreshes fault-job-info hourly
RELEASE_S = 10.0  # the reference's ReleaseTimeOut before a recovered job's entry goes
QUEUE_MAX = 10_000
PENDING_RETRY_S = 2.0


class KubeSession(Protocol):
    """What the control ConfigMaps use of clusterd's Kubernetes component once it started
    (:class:`clusterd.kube.component.KubeComponent`): ``enabled``, its ``api``, a ConfigMap
    ``watcher`` with its metrics, and ``run_led`` (a writer run while this replica leads)."""

    enabled: bool
    api: KubeApi | None

    def watcher(
        self, name: str, kind: str, ns: str | None, selector: str, handler: Handler, accept
    ) -> ListWatcher: ...
    def run_led(self, name: str, writer: Callable[[], Awaitable[None]]) -> None: ...


@dataclass(frozen=True)
class ControlConfig:
    """The control ConfigMaps' configuration section (:func:`faultmesh.config.section`):
    ``kube_slownode_namespace`` ``--kube-slownode-namespace`` (ras-feature-slownode-*; empty: all),
    ``kube_fault_job_info_namespace`` ``--kube-fault-job-info-namespace`` (fault-job-info),
    ``kube_data_trace_configmaps`` ``--kube-data-trace-configmaps`` (on: write data-trace-<job>)."""

    kube_slownode_namespace: str
    kube_fault_job_info_namespace: str
    kube_data_trace_configmaps: str


def add_arguments(g) -> None:
    """The flags of this part (an argparse group)."""
    g.add_argument(
        "--kube-slownode-namespace",
        default="",
        help="namespace of ras-feature-slownode-* ConfigMaps (empty: all)",
    )
    g.add_argument(
        "--kube-fault-job-info-namespace",
        default="cluster-system",
        help="namespace of fault-job-info (reference: cluster-system)",
    )
    g.add_argument(
        "--kube-data-trace-configmaps",
        choices=("on", "off"),
        default="on",
        help="write data-trace-<job> in the job's namespace on each switch change, delete it with the "
        "job (the reference's; needs ConfigMap create/patch/delete there)",
    )


class ControlMaps:
    """See the module docstring; a component of clusterd, started after the Kubernetes component and
    the slow-node one (whose jobs resumed from the store are then known). ``cfg``: its section
    (:class:`ControlConfig`); ``kube``: the Kubernetes component (:class:`KubeSession`); ``jobs``:
    the job registry; ``store``: the clusterd store (the data-trace versions applied); ``checks``:
    the ConfigMap checks shared with the slow-node part (its ``metrics`` count the fault-job-info
    writes); ``spawn``: the task owner's; ``slownode``: slow-node detection's ConfigMaps
    (:class:`~clusterd.slownode.kube.SlowNodeConfigMaps`; None: not watched); ``data_trace``: the
    brain's :class:`clusterd.brain.datatrace.DataTrace`; ``topology``: :data:`Topology`."""

    name = "kube-control"

    def __init__(
        self, cfg: ControlConfig, kube: KubeSession, jobs, store, checks: ConfigMapChecks,
        spawn: Callable[..., asyncio.Task], slownode: SlowNodeConfigMaps | None = None, data_trace=None,
        topology: Topology | None = None,
    ) -> None:  # fmt: skip
        self.cfg = cfg
        self.kube = kube
        self.jobs = jobs
        self.store = store
        self.checks = checks
        self.metrics = checks.metrics
        self._spawn = spawn
        self.api: KubeApi | None = None
        self.slownode = slownode
        self.data_trace = data_trace
        self.topology: Topology = topology or (lambda node: None)
        self.release_s = RELEASE_S
        self.pending: dict[tuple[str, str], tuple[str, dict]] = {}  # (kind, ns/name) -> (kind, obj)
        self._queue: collections.deque[tuple[str, str, dict | None]] = collections.deque(maxlen=QUEUE_MAX)
        self._due = asyncio.Event()
        self.written: dict[str, str] = {}  # job id -> fault-job-info value written
        self._later: list[tuple[float, str]] = []  # (monotonic due, job id) of delayed removals
        self.slownode_synced = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.handled: collections.Counter[str] = collections.Counter()  # versions handled, by kind
        self.processed = 0  # fault-job-info decisions handled (tests)
        self.dt_writer: DataTraceConfigMaps | None = None  # data-trace-<job> (Kubernetes mode)
        if jobs is not None:
            jobs.listen(self._on_job)

    async def start(self) -> None:
        """In Kubernetes mode: watch the control ConfigMaps, keep the slow-node jobs in step with them
        (:meth:`maintain`) and write fault-job-info while this replica leads."""
        if not self.kube.enabled or self.kube.api is None:
            return
        self.api = self.kube.api
        watchers = [
            self.kube.watcher(n, "configmaps", ns, sel, h, acc) for n, ns, sel, h, acc in self.watches()
        ]
        for w in watchers:
            self._tasks.append(self._spawn(w.run(), name=f"kube-watch-{w.kind}-{w.namespace or 'all'}"))
        self._tasks.append(self._spawn(self.maintain(watchers[0]), name="kube-control"))
        self.kube.run_led("fault-job-info", self.run)
        if self.data_trace is not None and self.cfg.kube_data_trace_configmaps == "on":
            wait_s = 2 * self.api.timeout_s + 1
            self.dt_writer = DataTraceConfigMaps(self.api, self.metrics, self.store, wait_s)
            self.data_trace.sinks.append(self.dt_writer.changed)
            self.kube.run_led("data-trace", self.dt_writer.run)

    async def stop(self) -> None:
        """Cancel the watches (bounded, 5 s) before the Kubernetes component closes its client."""
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks.clear()

    def watches(self) -> list[tuple[str, str | None, str, Callable[[str, dict], Awaitable[None]], Callable]]:
        """(name, namespace, label selector, handler, accept) of the ConfigMap watches."""

        def accept(o: dict) -> bool:
            meta = o.get("metadata") or {}
            labelled = (meta.get("labels") or {}).get(DATATRACE_LABEL[0]) == DATATRACE_LABEL[1]
            return labelled and str(meta.get("name", "")).startswith(DATATRACE_PREFIX)

        out = [("datatrace", None, "=".join(DATATRACE_LABEL), self.on_datatrace, accept)]
        if self.slownode is not None:  # the first: maintain() sweeps after its first list
            name, ns, selector, accept_sn = self.slownode.watch()
            out.insert(0, (name, ns, selector, self.on_slownode, accept_sn))
        return out

    async def _handle(self, kind: str, fn, op: str, obj: dict) -> None:
        ns, name = configmap_name(obj)
        self.pending.pop((kind, f"{ns}/{name}"), None)
        try:
            await fn(op, obj, f"{ns}/{name}")
        finally:
            self.handled[kind] += 1

    # -- ras-feature-slownode-<job> ----------------------------------------------------------------
    async def on_slownode(self, op: str, obj: dict) -> None:
        """A ras-feature-slownode ConfigMap changed (see the module docstring)."""
        await self._handle("slownode", self._on_slownode, op, obj)

    async def _on_slownode(self, op: str, obj: dict, where: str) -> None:
        if self.slownode is not None and await self.slownode.apply(op, obj, where):
            self.pending[("slownode", where)] = ("slownode", obj)  # tried again: retry_pending

    async def maintain(self, watcher, retry_s: float = PENDING_RETRY_S) -> None:
        """Until cancelled: once ``watcher`` (the slow-node ConfigMaps' ListWatcher) has listed, stop
        the ``kube`` jobs (resumed from the store) whose ConfigMap is gone
        (:meth:`SlowNodeConfigMaps.sweep`); then try the waiting ConfigMaps again every ``retry_s``
        (jobs loaded from the store at start announce nothing)."""
        await watcher.synced.wait()
        if self.slownode is not None:
            await self.slownode.sweep(watcher.objects.values())
        self.slownode_synced.set()
        while True:
            await asyncio.sleep(retry_s)
            if self.pending:
                try:
                    await self.retry_pending()
                except Exception as e:  # keep retrying
                    event(log, logging.ERROR, "control configmap retry failed", error=repr(e))

    # -- data-trace-<job> --------------------------------------------------------------------------
    async def on_datatrace(self, op: str, obj: dict) -> None:
        """A data-trace ConfigMap changed (see the module docstring)."""
        await self._handle("datatrace", self._on_datatrace, op, obj)

    async def _on_datatrace(self, op: str, obj: dict, where: str) -> None:
        ns, name = configmap_name(obj)
        key = ("datatrace", where)
        if op == "delete":
            event(log, logging.INFO, "data-trace configmap deleted, the switch stays", configmap=where)
            return
        text = self.checks.value("datatrace", obj, SWITCH_KEY, "datatrace_no_switch")
        if text is None:
            return
        try:
            sw = orjson.loads(text)
            if not isinstance(sw, dict):
                raise ValueError(f"{SWITCH_KEY} is {type(sw).__name__}, not an object")
            wrong = [f for f in SWITCH_FIELDS if f in sw and not isinstance(sw[f], str)]
            if wrong:
                raise ValueError(f"{wrong[0]} must be a string")
        except ValueError as e:
            self.checks.reject("datatrace_bad_switch", obj, str(e))
            return
        unknown = sorted(set(sw) - set(SWITCH_FIELDS))
        if unknown:
            self.checks.reject(
                "datatrace_unknown_field", obj, "ignored: " + ",".join(map(str, unknown))[:200]
            )
        if await self.store.kv_get(STORE_NS, where) == text:
            return  # this version was applied (before a restart): a later gRPC change stands
        value = {f: sw.get(f, "") for f in SWITCH_FIELDS}
        if self.dt_writer is not None and self.dt_writer.known.get((ns, name)) == value:
            return  # the echo guard: what clusterd wrote (or applied) itself
        job = name[len(DATATRACE_PREFIX) :]
        if self.data_trace is None or (self.jobs is not None and self.jobs.by_ns_name(ns, job) is None):
            self.pending[key] = ("datatrace", obj)  # the job is not known yet
            return
        if self.dt_writer is not None:
            self.dt_writer.known[(ns, name)] = value  # the ConfigMap holds it: not written back
        try:
            await self.data_trace.set_switch(f"{ns}/{job}", value)
        except DataTraceError as e:
            self.checks.reject(f"datatrace_{e.code}", obj, str(e))
            return
        await self.store.kv_put(STORE_NS, where, text)

    # -- pending ConfigMaps and job changes ----------------------------------------------------------
    async def _on_job(self, job, deleted: bool) -> None:
        if deleted and self.dt_writer is not None:
            self.dt_writer.deleted(job.namespace, job.name)
        if not deleted:
            await self.retry_pending()
        elif job.id in self.written:
            self._queue.append(("clear", job.id, None))
            self._due.set()

    async def retry_pending(self) -> None:
        """Try every waiting ConfigMap again (on each job change and every few seconds; their
        rejections were counted when they came)."""
        self.checks.retrying = True
        try:
            for key, (kind, obj) in list(self.pending.items()):
                if key in self.pending:
                    await (self.on_slownode if kind == "slownode" else self.on_datatrace)("upsert", obj)
        finally:
            self.checks.retrying = False

    # -- fault-job-info ------------------------------------------------------------------------------
    def on_decision(self, job_id: str, rec: dict) -> None:
        """The decision-log listener (never waits): queue the fault-job-info write or removal."""
        d = rec.get("decision", "")
        if d in WRITE_DECISIONS and rec.get("faults"):
            self._queue.append(("write", job_id, rec))
        elif d == "recover-success" and job_id in self.written:
            self._later.append((time.monotonic() + self.release_s, job_id))
        else:
            return
        self._due.set()

    async def _patch(self, data: dict[str, str | None]) -> bool:
        assert self.api is not None
        ns = self.cfg.kube_fault_job_info_namespace
        try:
            try:
                await self.api.patch_config_map(ns, FAULT_JOB_INFO, {"data": data})
            except KubeError as e:
                if e.status != 404:
                    raise
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": FAULT_JOB_INFO, "namespace": ns},
                        "data": {k: v for k, v in data.items() if v is not None}}  # fmt: skip
                if body["data"]:
                    await self.api.create_config_map(ns, body)
        except KubeError as e:
            self.metrics.writes.labels("fault_job_info", "error").inc()
            self.metrics.api_errors.labels(e.op, str(e.status)).inc()
            event(log, logging.WARNING, "fault-job-info write failed", error=str(e))
            return False
        self.metrics.writes.labels("fault_job_info", "ok").inc()
        return True

    async def _write(self, job_id: str, rec: dict) -> None:
        job = self.jobs.get(job_id) if self.jobs is not None else None
        if job is None:
            return
        nodes = {f["node"] for f in rec.get("faults") or [] if f.get("node")}
        info = fault_job_info(job, nodes, self.topology, int(time.time()))
        if info is None:
            return
        value = go_json(info)
        if await self._patch({job_id: value}):
            self.written[job_id] = value
            event(
                log,
                logging.INFO,
                "fault-job-info written",
                job=job.ns_name,
                fault_nodes=",".join(sorted(nodes)),
            )

    async def _clear(self, job_id: str) -> None:
        if job_id in self.written and await self._patch({job_id: None}):
            del self.written[job_id]
            event(log, logging.INFO, "fault-job-info cleared", job=job_id)

    async def read_back(self) -> None:
        """Learn the entries the ConfigMap holds (written before a restart, or by another leader),
        so that they are cleared as this replica's own. Raises :class:`KubeError` (not 404)."""
        assert self.api is not None
        try:
            cm = await self.api.get_config_map(self.cfg.kube_fault_job_info_namespace, FAULT_JOB_INFO)
        except KubeError as e:
            if e.status != 404:
                raise
            return
        data = cm.get("data") or {}
        for job_id, value in data.items() if isinstance(data, dict) else ():
            self.written.setdefault(str(job_id), str(value))

    async def refresh(self) -> None:
        """Remove the entries of jobs no longer known (the reference's hourly refresh)."""
        await self.read_back()
        for job_id in [j for j in self.written if self.jobs is None or self.jobs.get(j) is None]:
            await self._clear(job_id)

    async def run(self) -> None:
        """The fault-job-info writer (a leader's writer), until cancelled; nothing raises out."""
        next_refresh = time.monotonic() + REFRESH_S
        try:
            await self.read_back()
        except KubeError as e:
            event(log, logging.WARNING, "fault-job-info read failed", error=str(e))
        while True:
            wake = min([next_refresh] + [t for t, _ in self._later])
            try:
                await wait_for(self._due.wait(), max(0.05, wake - time.monotonic()))
            except TimeoutError:
                pass
            self._due.clear()
            try:
                now = time.monotonic()
                if now >= next_refresh:
                    next_refresh = now + REFRESH_S
                    await self.refresh()
                for due, job_id in [x for x in self._later if x[0] <= now]:
                    self._later.remove((due, job_id))
                    await self._clear(job_id)
                while self._queue:
                    op, job_id, rec = self._queue.popleft()
                    if op == "write":
                        await self._write(job_id, rec or {})
                    else:
                        await self._clear(job_id)
                    self.processed += 1
            except Exception as e:  # one bad decision must not stop the writer
                event(log, logging.ERROR, "fault-job-info writer failed", error=repr(e))
