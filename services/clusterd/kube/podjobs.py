"""Kubernetes mode, jobs from pods (``--kube-jobs on``): NPU pods (device and ``hccl/rankIndex``
annotations) grouped by their controlling owner become jobs in the brain's job registry
(:mod:`.jobs`), with the recovery settings of their PodGroup (:mod:`.podgroups`, when watched); a
job whose pods are all gone is removed (only jobs this component created, remembered in the store
namespace ``kube-jobs``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from clusterd.brain.jobs import JobRegistry
from clusterd.kube import jobs as kjobs
from clusterd.kube.metrics import KubeMetrics
from clusterd.store import Store
from faultmesh.jobspec import JobSpecError, parse_job
from faultmesh.kubewatch import ListWatcher
from faultmesh.log import event

log = logging.getLogger("clusterd.kube")

STORE_NS = "kube-jobs"


class PodJobs:
    """Pod events -> job registry (see the module docstring). ``pod_watch`` is set at start."""

    def __init__(self, registry: JobRegistry, store: Store, metrics: KubeMetrics, podgroups=None) -> None:
        self.registry = registry
        self.podgroups = podgroups
        self.store = store
        self.metrics = metrics
        self.pod_watch: ListWatcher | None = None
        self._job_pods: dict[str, dict[tuple[str, str], dict]] = {}  # job id -> pod key -> pod
        self._pod_job: dict[tuple[str, str], tuple[str, str, str]] = {}  # pod key -> (job id, name, ns)
        self._jobs_dirty: set[tuple[str, str, str]] = set()
        self._jobs_event = asyncio.Event()
        self._changed = asyncio.Event()  # replaced after each pod event (wakes every waiter)

    async def on_pod(self, op: str, pod: dict) -> None:
        """Watch handler of pods."""
        self._changed.set()
        self._changed = asyncio.Event()
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._pod_job.pop(key, None)
        if old is not None:
            self._job_pods.get(old[0], {}).pop(key, None)
            self._jobs_dirty.add(old)
        owner = kjobs.job_owner(pod) if op == "upsert" else None
        if owner is not None:
            job = (owner[0], owner[1], key[0])
            self._pod_job[key] = job
            self._job_pods.setdefault(job[0], {})[key] = pod
            self._jobs_dirty.add(job)
        self._jobs_event.set()

    def touch(self, job_id: str) -> None:
        """Re-apply ``job_id`` (its PodGroup changed)."""
        job = next((j for j in self._pod_job.values() if j[0] == job_id), None)
        if job is not None:
            self._jobs_dirty.add(job)
            self._jobs_event.set()

    def changed(self) -> asyncio.Event:
        """An event set at the next pod event (wait on it, then look at :meth:`pods_of` again)."""
        return self._changed

    def pods_of(self, job_id: str) -> list[dict]:
        """The job's pods (watch objects)."""
        return list(self._job_pods.get(job_id, {}).values())

    async def _sync_job(self, job_id: str, name: str, namespace: str) -> None:
        registry = self.registry
        pods = list(self._job_pods.get(job_id, {}).values())
        owned = await self.store.kv_get(STORE_NS, job_id)
        if not pods:
            self._job_pods.pop(job_id, None)
            if owned is not None:
                await registry.delete(job_id)
                await self.store.kv_delete(STORE_NS, job_id)
                event(log, logging.INFO, "kube job removed", job=f"{namespace}/{name}", jobId=job_id)
            return
        settings, extra = self.podgroups.settings(job_id) if self.podgroups is not None else ({}, {})
        try:
            job = parse_job(kjobs.job_spec(job_id, name, namespace, pods, settings))
        except (kjobs.BadPod, JobSpecError) as e:
            self.metrics.reject("bad_job_pods", job=f"{namespace}/{name}", error=str(e))
            return
        if extra:
            job = dataclasses.replace(job, extra={**job.extra, **extra})
        other = registry.by_ns_name(namespace, name)
        if other is not None and other.id != job_id:
            if await self.store.kv_get(STORE_NS, other.id) is None:
                self.metrics.reject("job_name_taken", job=f"{namespace}/{name}", other=other.id)
                return
            await registry.delete(other.id)  # the job was re-created under a new UID
            await self.store.kv_delete(STORE_NS, other.id)
        if owned is None:
            await self.store.kv_put(STORE_NS, job_id, {"name": name, "namespace": namespace})
        (res,) = await registry.apply([job], keep_held=True)  # a degrade stays (JobRegistry)
        if res[1] != "unchanged":
            event(
                log,
                logging.INFO,
                f"kube job {res[1]}",
                job=f"{namespace}/{name}",
                jobId=job_id,
                ranks=len(job.ranks),
                status=job.status,
            )

    async def run(self) -> None:
        """Apply the jobs whose pods changed (debounced), and after the first pod list remove the
        jobs this component created whose pods are all gone. Runs until cancelled."""
        reconciled = False
        while True:
            await self._jobs_event.wait()
            await asyncio.sleep(0.1)  # let a burst of pod events settle
            self._jobs_event.clear()
            dirty, self._jobs_dirty = self._jobs_dirty, set()
            if not reconciled and self.pod_watch is not None and self.pod_watch.synced.is_set():
                reconciled = True
                for job_id, info in (await self.store.kv_items(STORE_NS)).items():
                    if job_id not in self._job_pods:
                        dirty.add((job_id, str(info.get("name", "")), str(info.get("namespace", ""))))
            for job_id, name, ns in sorted(dirty):
                try:
                    await self._sync_job(job_id, name, ns)
                except Exception as e:  # a store error must not stop discovery
                    event(log, logging.ERROR, "kube job not applied", job=f"{ns}/{name}", error=repr(e))
            if not reconciled:
                self._jobs_event.set()
                await asyncio.sleep(0.2)
