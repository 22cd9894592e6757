"""Kubernetes mode, Volcano PodGroups (issue 15; reference clusterd.md §7.1): a job's recovery
settings as the reference reads them.

The PodGroup of a job is the one whose controlling owner (the vcjob or AscendJob) has the job's
UID -- the reference's jobId, the same owner the job's pods have (:func:`clusterd.kube.jobs.job_owner`).
From it (labels and annotations alike, as the Ascend Operator sets either):

- ``recover-strategy`` (annotation), ``process-recover-enable``, ``fault-scheduling``,
  ``pod-rescheduling``, ``subHealthyStrategy`` (labels) -- they override the pods' values;
- ``wait-reschedule-timeout`` (annotation, 30..270 s, default 270) and ``fault-retry-times``
  (annotation or label, a non-negative integer), kept in the job's ``extra``;
- ``huawei.com/schedule.filter.faultCode`` / ``.faultLevel`` (annotations): the job's fault filter
  (:mod:`faultmesh.faultfilter`, :mod:`clusterd.brain.customfilter`);
- ``status.phase`` (the hand-off waits for ``Running``).

A value the reference would refuse is dropped with a logged, counted reason
(``faultmesh_rejected_requests_total{service="kube",reason="bad_podgroup"}``); the job keeps the
rest. A PodGroup change re-applies its job (``on_change(job_id)``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from clusterd.kube import jobs as kjobs
from clusterd.kube.metrics import KubeMetrics
from faultmesh import faultfilter
from faultmesh.jobspec import STRATEGY_PRIORITY, SUBHEALTH_STRATEGIES
from faultmesh.runtime import wait_for

GROUP, VERSION, PLURAL = "scheduling.volcano.sh", "v1beta1", "podgroups"
KIND = f"custom:{GROUP}/{VERSION}/{PLURAL}"
WAIT_RESCHEDULE = "wait-reschedule-timeout"
FAULT_RETRY_TIMES = "fault-retry-times"
WAIT_RESCHEDULE_DEFAULT_S = 270
ALLOWED = {
    "process-recover-enable": ("on", "pause", "off", ""),
    "fault-scheduling": ("grace", "force", "off", ""),
    "pod-rescheduling": ("on", "off", ""),
    "subHealthyStrategy": (*SUBHEALTH_STRATEGIES, ""),
}


def _meta_value(obj: dict, key: str) -> str | None:
    meta = obj.get("metadata") or {}
    for part in ("annotations", "labels"):
        v = (meta.get(part) or {}).get(key)
        if v is not None:
            return str(v)
    return None


def read_settings(pg: dict) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(settings for the job spec, extra, problems) of one PodGroup object."""
    settings: dict[str, str] = {}
    problems: list[str] = []
    for key in kjobs.SETTING_KEYS:
        v = _meta_value(pg, key)
        if v is None:
            continue
        if key == "recover-strategy":
            bad = [s for s in (x.strip() for x in v.split(",")) if s and s not in STRATEGY_PRIORITY]
            if bad:
                problems.append(f"{key} has unknown values {bad}")
                v = ",".join(s.strip() for s in v.split(",") if s.strip() in STRATEGY_PRIORITY)
        elif v not in ALLOWED[key]:
            problems.append(f"{key}={v!r}")
            continue
        settings[key] = v
    for key, kind in ((faultfilter.CODE_KEY, "code"), (faultfilter.LEVEL_KEY, "level")):
        v = _meta_value(pg, key)
        if v is not None:  # the entries the reference would use; the rest dropped, with a reason
            text, bad = faultfilter.clean(v[:4096], kind)
            problems.extend(f"{key}: {b}" for b in bad)
            if text:
                settings[key] = text
    extra: dict[str, str] = {}
    raw = _meta_value(pg, WAIT_RESCHEDULE)
    wait = WAIT_RESCHEDULE_DEFAULT_S
    if raw is not None:
        try:
            wait = int(raw)
            if not 30 <= wait <= 270:
                raise ValueError
        except ValueError:
            problems.append(f"{WAIT_RESCHEDULE}={raw!r} (30..270)")
            wait = WAIT_RESCHEDULE_DEFAULT_S
    extra[WAIT_RESCHEDULE] = str(wait)
    raw = _meta_value(pg, FAULT_RETRY_TIMES)
    if raw is not None:
        if raw.isdigit() and int(raw) <= 1000:
            extra[FAULT_RETRY_TIMES] = raw
        else:
            problems.append(f"{FAULT_RETRY_TIMES}={raw!r}")
    return settings, extra, problems


class PodGroups:
    """The PodGroups watch handler and index by job id (see the module docstring)."""

    def __init__(self, metrics: KubeMetrics, on_change: Callable[[str], None]) -> None:
        self.metrics = metrics
        self.on_change = on_change
        self._by_job: dict[str, dict] = {}  # job id -> PodGroup object
        self._job_of: dict[tuple[str, str], str] = {}  # (ns, name) -> job id
        self._changed = asyncio.Event()  # replaced after each change (wakes every waiter)

    def get(self, job_id: str) -> dict | None:
        """The job's PodGroup object, or None."""
        return self._by_job.get(job_id)

    def settings(self, job_id: str) -> tuple[dict[str, str], dict[str, str]]:
        """(settings, extra) of the job's PodGroup ({} and {} without one)."""
        pg = self._by_job.get(job_id)
        if pg is None:
            return {}, {}
        settings, extra, _ = read_settings(pg)
        return settings, extra

    def phase(self, job_id: str) -> str:
        """The PodGroup's ``status.phase`` ("" without one)."""
        pg = self._by_job.get(job_id) or {}
        return str((pg.get("status") or {}).get("phase") or "")

    async def wait_phase(self, job_id: str, phase: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the job's PodGroup to reach ``phase``. True when it did."""
        deadline = time.monotonic() + timeout_s
        while self.phase(job_id) != phase:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await wait_for(self._changed.wait(), left)
            except TimeoutError:
                return False
        return True

    async def on_podgroup(self, op: str, pg: dict) -> None:
        """Watch handler of PodGroups."""
        self._changed.set()
        self._changed = asyncio.Event()
        meta = pg.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._job_of.pop(key, None)
        if old is not None:
            self._by_job.pop(old, None)
        owner = kjobs.job_owner(pg) if op == "upsert" else None
        if owner is not None:
            job_id = owner[0]
            _, _, problems = read_settings(pg)
            if problems:
                self.metrics.reject("bad_podgroup", podgroup=f"{key[0]}/{key[1]}", error="; ".join(problems))
            self._by_job[job_id] = pg
            self._job_of[key] = job_id
            self.on_change(job_id)
        if old is not None and old != (owner or ("",))[0]:
            self.on_change(old)
