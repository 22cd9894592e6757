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
    """

    NS = "jobs"

    def __init__(self, store) -> None:
        self._store = store
        self._jobs: dict[str, Job] = {}
        self._by_node: dict[str, set[str]] = {}  # node -> ids of jobs with a rank there
        self._listeners: list = []

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

    async def apply(self, jobs: list[Job]) -> list[tuple[Job, str]]:
        """Create or update jobs. Returns [(job, "created"|"updated"|"unchanged")]. Durable on return.

        Raises :class:`JobSpecError` when a job's namespace/name belongs to another id.
        """
        for job in jobs:
            other = self.by_ns_name(job.namespace, job.name)
            if other is not None and other.id != job.id:
                raise JobSpecError(f"job {job.ns_name} already exists with id {other.id}")
        out = []
        now = now_ms()
        for job in jobs:
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

    async def update(self, job_id: str, **changes: Any) -> Job | None:
        """Change fields of a stored job (e.g. ``process_recover_enable="on"``). None if unknown."""
        old = self._jobs.get(job_id)
        if old is None:
            return None
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
        self._index(None, job)
        await self._notify(job, True)
        return job
