"""The job registry: every known training job, persisted (issue 7 "Jobs").

The job-file format and parsing are core (:mod:`faultmesh.jobspec`, shared with the CLI); this
module keeps the registry ClusterD serves from and re-exports the format's names.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from faultmesh.jobspec import (
    FRAMEWORKS,
    STATUSES,
    STRATEGY_PRIORITY,
    SUBHEALTH_STRATEGIES,
    Job,
    JobSpecError,
    Rank,
    job_from_store,
    parse_job,
    parse_jobs,
    parse_jobs_text,
)
from faultmesh.model import now_ms

__all__ = [
    "FRAMEWORKS",
    "STATUSES",
    "STRATEGY_PRIORITY",
    "SUBHEALTH_STRATEGIES",
    "Job",
    "JobRegistry",
    "JobSpecError",
    "Rank",
    "job_from_store",
    "parse_job",
    "parse_jobs",
    "parse_jobs_text",
]


class JobRegistry:
    """Every known job by id, persisted in the ClusterD store (namespace ``jobs``).

    Listeners ``cb(job, deleted: bool)`` run after each change (sync or async).
    Given to other components (``jobs=``) so they resolve ranks -> (node, device).

    A change made with ``update(..., hold=True)`` (the controller's degrade of subHealthyStrategy to
    ``ignore``, the reference's in-memory ``ctl.jobInfo.SubHealthyStrategy``) is held against
    ``apply(..., keep_held=True)`` -- the Kubernetes pod sync, which re-reads the PodGroup's labels:
    while the source still says what the held change replaced, the held value stays; a source that
    says something else, an apply without ``keep_held`` (a user's job apply) or the job's deletion
    ends the hold. Holds live in memory (a ClusterD restart forgets them, as the reference's
    controller does).
    """

    NS = "jobs"

    def __init__(self, store) -> None:
        self._store = store
        self._jobs: dict[str, Job] = {}
        self._by_node: dict[str, set[str]] = {}  # node -> ids of jobs with a rank there
        self._listeners: list = []
        self._held: dict[str, dict[str, tuple[Any, Any]]] = {}  # id -> field -> (replaced, held value)

    def _index(self, job: Job | None, old: Job | None) -> None:
        for n in {r.node for r in old.ranks} if old else ():
            ids = self._by_node.get(n)
            if ids is not None:
                ids.discard(old.id)
                if not ids:
                    del self._by_node[n]
        for n in {r.node for r in job.ranks} if job else ():
            self._by_node.setdefault(n, set()).add(job.id)

    async def load(self) -> int:
        """Read the stored jobs (bad records are skipped). Returns how many."""
        for key, value in (await self._store.kv_items(self.NS)).items():
            try:
                self._jobs[key] = job_from_store(value)
                self._index(self._jobs[key], None)
            except (JobSpecError, TypeError, ValueError):
                continue
        return len(self._jobs)

    def listen(self, cb) -> None:
        """Call ``cb(job, deleted)`` after every apply/delete/status change."""
        self._listeners.append(cb)

    async def _notify(self, job: Job, deleted: bool) -> None:
        for cb in list(self._listeners):
            res = cb(job, deleted)
            if asyncio.iscoroutine(res):
                await res

    def get(self, job_id: str) -> Job | None:
        """The job with UID ``job_id`` or None."""
        return self._jobs.get(job_id)

    def by_ns_name(self, namespace: str, name: str) -> Job | None:
        """The job named ``namespace/name`` or None."""
        for j in self._jobs.values():
            if j.namespace == namespace and j.name == name:
                return j
        return None

    def all(self) -> list[Job]:
        """Every job, by namespace, name."""
        return sorted(self._jobs.values(), key=lambda j: (j.namespace, j.name, j.id))

    def jobs_on_node(self, node: str) -> list[Job]:
        """Jobs with at least one rank on ``node``, by namespace, name."""
        jobs = [self._jobs[i] for i in self._by_node.get(node, ())]
        return sorted(jobs, key=lambda j: (j.namespace, j.name, j.id))

    def __len__(self) -> int:
        return len(self._jobs)

    async def apply(self, jobs: list[Job], keep_held: bool = False) -> list[tuple[Job, str]]:
        """Create or update jobs. Returns [(job, "created"|"updated"|"unchanged")]. Durable on return.
        ``keep_held``: held changes stay while the job's source is unchanged (class docstring).

        Raises :class:`JobSpecError` when a job's namespace/name belongs to another id.
        """
        for job in jobs:
            other = self.by_ns_name(job.namespace, job.name)
            if other is not None and other.id != job.id:
                raise JobSpecError(f"job {job.ns_name} already exists with id {other.id}")
        out = []
        now = now_ms()
        for job in jobs:
            job = self._with_held(job) if keep_held else job
            if not keep_held:
                self._held.pop(job.id, None)
            old = self._jobs.get(job.id)
            if old is not None and replace(old, created_ms=0, updated_ms=0) == job:
                out.append((old, "unchanged"))
                continue
            job = replace(job, created_ms=old.created_ms if old else now, updated_ms=now)
            await self._store.kv_put(self.NS, job.id, job.to_dict())
            self._jobs[job.id] = job
            self._index(job, old)
            out.append((job, "updated" if old else "created"))
            await self._notify(job, False)
        return out

    def _with_held(self, job: Job) -> Job:
        """``job`` with its held changes where its source still says what they replaced; a hold
        whose source changed ends."""
        held = self._held.get(job.id)
        if not held:
            return job
        keep = {f: (was, now) for f, (was, now) in held.items() if getattr(job, f) in (was, now)}
        if keep:
            self._held[job.id] = keep
        else:
            self._held.pop(job.id, None)
        return replace(job, **{f: v[1] for f, v in keep.items()}) if keep else job

    async def update(self, job_id: str, hold: bool = False, **changes: Any) -> Job | None:
        """Change fields of a stored job (e.g. ``process_recover_enable="on"``). None if unknown.
        ``hold``: keep the change against the Kubernetes pod sync (class docstring)."""
        old = self._jobs.get(job_id)
        if old is None:
            return None
        if hold:
            held = self._held.setdefault(job_id, {})
            for f, v in changes.items():
                replaced = held[f][0] if f in held else getattr(old, f)
                held[f] = (replaced, v)
        job = replace(old, updated_ms=now_ms(), **changes)
        await self._store.kv_put(self.NS, job.id, job.to_dict())
        self._jobs[job.id] = job
        self._index(job, old)
        await self._notify(job, False)
        return job

    async def delete(self, job_id: str) -> Job | None:
        """Remove a job. Returns it, or None when unknown."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        await self._store.kv_delete(self.NS, job_id)  # stored first: a refused delete changes nothing
        del self._jobs[job_id]
        self._held.pop(job_id, None)
        self._index(None, job)
        await self._notify(job, True)
        return job
