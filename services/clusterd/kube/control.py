"""Kubernetes mode, the control ConfigMaps the reference's docs tell operators to ``kubectl apply``,
and ``fault-job-info`` (issue 15; reference fdol.md §3, §7; clusterd.md §3, §7.3; noded.md §8).

- ``ras-feature-slownode-<job>`` (label ``fd-ol-slow-node=true``, any namespace, or
  ``--kube-slownode-namespace``; key ``FeatConf``, the FeatConf JSON of fdol.md §7): added or
  changed -> slow-node detection of the job starts or is updated (``SlowNode: 0`` stops it);
  deleted -> it stops. The job's placement comes from the job registry (pods / PodGroups, or
  ``POST /v1/jobs``); a FeatConf for a job not known yet waits (``pending``) and starts when the
  job appears, as the reference waits for the job summary. Detection is
  :class:`clusterd.slownode.component.SlowNodeComponent`'s (source ``kube``); after the first list a ``kube``
  job whose ConfigMap is gone is stopped.
- ``data-trace-<job>`` (label ``reset=true``, the job's namespace; key ``profilingSwitch`` = JSON
  ``{"CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader"}``): each new version
  sets the job's switch through the brain's TrainingDataTrace (the same effect as the gRPC
  ``ModifyTrainingDataTraceSwitch``: state, the switch file, subscribers, the job's nodes); an
  omitted field becomes "". A version already applied (its text, kept in the store) is not
  applied again after a restart, so a later gRPC change is not undone. A deleted ConfigMap
  changes nothing (the reference deletes it with the job).
- ``fault-job-info`` (``--kube-fault-job-info-namespace``, cluster-system), written as the reference's
  ClusterD does for the A3 forced release (NodeD releases the fault super-devices' resources):
  key = job id, value = Go JSON of ``{"<superPodId>": {"SdIds": [..], "FaultNodes": {"<node>":
  {}}, "NodeNames": [the job's other nodes in that super pod], "FaultTimes": <unix s>, "JobId":
  ".."}}``; written on a fault decision (``stop-train`` / ``pre-exit``) when every node of the job
  is in a known super pod (topology: :func:`clusterd.kube.faultjobinfo.slownet_topology`), removed on ``recover-success``
  (after ``release_s``, the reference's 10 s), when the job is deleted, and hourly for jobs no
  longer known.

Bad input (truncated JSON, unknown keys, values over 64 KiB, wrong types, an invalid FeatConf) is
refused with a logged, counted reason (``faultmesh_rejected_requests_total{service="kube",reason}``,
reasons ``slownode_*`` / ``datatrace_*``); nothing else changes. Unknown FeatConf keys are counted
(``slownode_featconf_unknown_keys``) and ignored, as the reference ignores them.

Deliberate differences: fault-job-info is written at the fault decision (the reference writes it
in NotifyGlobalFault, a few seconds later); a changed ras-feature-slownode ConfigMap applies every
FeatConf key (the reference copies only SlowNode/Servers/RankIds until delete + add).
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
from clusterd.kube.faultjobinfo import Topology, fault_job_info, go_json
from clusterd.kube.metrics import KubeMetrics
from clusterd.slownode.jobs import EnableError, unwrap_configmap
from faultmesh.kube import KubeApi, KubeError
from faultmesh.kubecm import config_map_values
from faultmesh.kubewatch import Handler, ListWatcher
from faultmesh.log import event
from faultmesh.runtime import wait_for
from fdol.slownode.featconf import FeatConfError, parse_featconf

log = logging.getLogger("clusterd.kube")

SLOWNODE_LABEL = ("fd-ol-slow-node", "true")
SLOWNODE_PREFIX = "ras-feature-slownode"
FEATCONF_KEY = "FeatConf"
DATATRACE_LABEL = ("reset", "true")
DATATRACE_PREFIX = "data-trace-"
SWITCH_KEY = "profilingSwitch"
SWITCH_FIELDS = ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader")
FAULT_JOB_INFO = "fault-job-info"
MAX_VALUE_BYTES = 64 * 1024
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
    ``kube_fault_job_info_namespace`` ``--kube-fault-job-info-namespace`` (fault-job-info)."""

    kube_slownode_namespace: str
    kube_fault_job_info_namespace: str


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


def _featconf_job(obj: dict) -> str | None:
    """The job id a ras-feature-slownode ConfigMap names (None when it names none)."""
    text = (obj.get("data") or {}).get(FEATCONF_KEY)
    try:
        return parse_featconf(orjson.loads(text)).job_id if isinstance(text, str) else None
    except (ValueError, FeatConfError):
        return None


def _name(obj: dict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class ControlMaps:
    """See the module docstring; a component of clusterd, started after the Kubernetes component and
    the slow-node one (whose jobs resumed from the store are then known). ``cfg``: its section
    (:class:`ControlConfig`); ``kube``: the Kubernetes component (:class:`KubeSession`); ``jobs``: the job registry; ``store``: the clusterd store (the
    data-trace versions applied); ``spawn``: the task owner's; ``slownode``: the slow-node component
    (``enable`` / ``disable`` / ``resolve_placement`` / ``jobs``; None: those ConfigMaps wait in
    ``pending``); ``data_trace``: the brain's :class:`clusterd.brain.datatrace.DataTrace`;
    ``topology``: :data:`Topology`."""

    name = "kube-control"

    def __init__(
        self, cfg: ControlConfig, kube: KubeSession, jobs, store, metrics: KubeMetrics,
        spawn: Callable[..., asyncio.Task], slownode=None, data_trace=None, topology: Topology | None = None,
    ) -> None:  # fmt: skip
        self.cfg = cfg
        self.kube = kube
        self.jobs = jobs
        self.store = store
        self.metrics = metrics
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
        self._applied_slownode: dict[str, str] = {}  # ns/name of a ConfigMap -> the job it enabled
        self.slownode_synced = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.handled: collections.Counter[str] = collections.Counter()  # versions handled, by kind
        self._retrying = False
        self.processed = 0  # fault-job-info decisions handled (tests)
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

    async def stop(self) -> None:
        """Cancel the watches (bounded, 5 s) before the Kubernetes component closes its client."""
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks.clear()

    def watches(self) -> list[tuple[str, str | None, str, Callable[[str, dict], Awaitable[None]], Callable]]:
        """(name, namespace, label selector, handler, accept) of the ConfigMap watches."""

        def named(label, prefix):
            def accept(o: dict) -> bool:
                meta = o.get("metadata") or {}
                return (meta.get("labels") or {}).get(label[0]) == label[1] and str(
                    meta.get("name", "")
                ).startswith(prefix)

            return accept

        return [
            ("slownode", self.cfg.kube_slownode_namespace or None, "=".join(SLOWNODE_LABEL), self.on_slownode,
             named(SLOWNODE_LABEL, SLOWNODE_PREFIX)),
            ("datatrace", None, "=".join(DATATRACE_LABEL), self.on_datatrace, named(DATATRACE_LABEL, DATATRACE_PREFIX)),
        ]  # fmt: skip

    def _reject(self, reason: str, obj: dict, why: str) -> None:
        if self._retrying:
            return  # counted when this version came
        ns, name = _name(obj)
        self.metrics.reject(reason, configmap=f"{ns}/{name}", error=why[:300])

    async def _handle(self, kind: str, fn, op: str, obj: dict) -> None:
        ns, name = _name(obj)
        self.pending.pop((kind, f"{ns}/{name}"), None)
        try:
            await fn(op, obj, f"{ns}/{name}")
        finally:
            self.handled[kind] += 1

    def _value(self, kind: str, obj: dict, key: str, missing: str) -> str | None:
        """The ConfigMap's ``key`` value; every other key, a bad value and a missing key are
        refused and counted (``<kind>_unknown_key``, ``<kind>_bad_value``, ``missing``)."""
        values, bad = config_map_values(obj, MAX_VALUE_BYTES)
        for k, why in bad:
            self._reject(f"{kind}_bad_value", obj, f"{k}: {why}")
        for k in sorted(set(values) - {key}):
            self._reject(f"{kind}_unknown_key", obj, f"unknown key {k[:80]!r} (known: {key})")
        if key not in values and not any(k == key for k, _ in bad):
            self._reject(missing, obj, f"no key {key}")
        return values.get(key)

    # -- ras-feature-slownode-<job> ----------------------------------------------------------------
    async def on_slownode(self, op: str, obj: dict) -> None:
        """A ras-feature-slownode ConfigMap changed (see the module docstring)."""
        await self._handle("slownode", self._on_slownode, op, obj)

    async def _on_slownode(self, op: str, obj: dict, where: str) -> None:
        key = ("slownode", where)
        sn = self.slownode
        if op == "delete":
            job_id = self._applied_slownode.pop(where, None)
            if sn is not None and job_id is not None and getattr(sn.jobs.get(job_id), "source", "") == "kube":
                await sn.disable(job_id)
            return
        text = self._value("slownode", obj, FEATCONF_KEY, "slownode_no_featconf")
        if text is None:
            return
        try:
            fc, ranks = unwrap_configmap({"data": {FEATCONF_KEY: text}})
            conf = parse_featconf(fc)
        except (EnableError, FeatConfError) as e:
            self._reject("slownode_bad_featconf", obj, str(e))
            return
        if conf.unknown_keys:
            self._reject(
                "slownode_featconf_unknown_keys", obj, "ignored: " + ",".join(conf.unknown_keys)[:200]
            )
        if sn is None:
            self.pending[key] = ("slownode", obj)
            return
        try:
            placement = {} if conf.slow_node == 0 else sn.resolve_placement(conf, ranks)
        except EnableError as e:
            self.pending[key] = ("slownode", obj)  # the job is not known yet: start when it is
            if not self._retrying:
                event(
                    log, logging.INFO, "slow-node configmap waits for its job",
                    configmap=where, job=conf.job_id, why=str(e),
                )  # fmt: skip
            return
        await sn.enable(conf, placement, "kube")
        self._applied_slownode[where] = conf.job_id

    async def maintain(self, watcher, retry_s: float = PENDING_RETRY_S) -> None:
        """Until cancelled: once ``watcher`` (the slow-node ConfigMaps' ListWatcher) has listed, stop
        the ``kube`` jobs (resumed from the store) whose ConfigMap is gone; then try the waiting
        ConfigMaps again every ``retry_s`` (jobs loaded from the store at start announce nothing)."""
        await watcher.synced.wait()
        sn = self.slownode
        if sn is not None:
            backed = {_featconf_job(o) for o in watcher.objects.values()}
            for job_id, js in list(sn.jobs.items()):
                if js.source == "kube" and job_id not in backed:
                    await sn.disable(job_id)
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
        ns, name = _name(obj)
        key = ("datatrace", where)
        if op == "delete":
            event(log, logging.INFO, "data-trace configmap deleted, the switch stays", configmap=where)
            return
        text = self._value("datatrace", obj, SWITCH_KEY, "datatrace_no_switch")
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
            self._reject("datatrace_bad_switch", obj, str(e))
            return
        unknown = sorted(set(sw) - set(SWITCH_FIELDS))
        if unknown:
            self._reject("datatrace_unknown_field", obj, "ignored: " + ",".join(map(str, unknown))[:200])
        if await self.store.kv_get(STORE_NS, where) == text:
            return  # this version was applied (before a restart): a later gRPC change stands
        job = name[len(DATATRACE_PREFIX) :]
        if self.data_trace is None or (self.jobs is not None and self.jobs.by_ns_name(ns, job) is None):
            self.pending[key] = ("datatrace", obj)  # the job is not known yet
            return
        try:
            await self.data_trace.set_switch(f"{ns}/{job}", {f: sw.get(f, "") for f in SWITCH_FIELDS})
        except DataTraceError as e:
            self._reject(f"datatrace_{e.code}", obj, str(e))
            return
        await self.store.kv_put(STORE_NS, where, text)

    # -- pending ConfigMaps and job changes ----------------------------------------------------------
    async def _on_job(self, job, deleted: bool) -> None:
        if not deleted:
            await self.retry_pending()
        elif job.id in self.written:
            self._queue.append(("clear", job.id, None))
            self._due.set()

    async def retry_pending(self) -> None:
        """Try every waiting ConfigMap again (on each job change and every few seconds; their
        rejections were counted when they came)."""
        self._retrying = True
        try:
            for key, (kind, obj) in list(self.pending.items()):
                if key in self.pending:
                    await (self.on_slownode if kind == "slownode" else self.on_datatrace)("upsert", obj)
        finally:
            self._retrying = False

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
