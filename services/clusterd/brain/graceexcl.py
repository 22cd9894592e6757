"""Graceful tolerance excludes process-level recovery (issue 32 item 9; :mod:`faultmesh.exclusions`).

The reference's user guide: graceful fault tolerance (the device plugin's hot-reset mode; faultmesh's
deviced ``--grace-tolerance``) cannot be on together with process-level rescheduling or
process-level online recovery; if both are on, training is recovered by Job-level rescheduling.
A job with process-level recovery (:func:`faultmesh.exclusions.process_level_recovery`) that has a
rank on a node whose deviced said ``graceTolerance=on`` in its Hello is therefore handled by the
fault intake as a job without a process-recovery client: its faults get the decision
``job-rescheduling`` (reason :func:`reason`) instead of the process-level flow, and deviced runs
no grace episode for it (it reads the same settings from its JobInfo).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from faultmesh.exclusions import process_level_recovery
from faultmesh.log import event

log = logging.getLogger("clusterd.brain")


def reason(node: str) -> str:
    """The decision reason of an excluded job's faults (``node``: its first graceful-tolerance node)."""
    return f"graceful tolerance on node {node} excludes process-level recovery; Job-level rescheduling"


class GraceExclusion:
    """Which jobs fall back to Job-level rescheduling. ``grace_node(node)``: whether ``node``'s
    deviced is in graceful-tolerance mode (the node registry's Hello labels). Each job excluded is
    logged once (``process-level recovery excluded``) and counted in
    ``faultmesh_brain_grace_exclusions_total``, again only after it was not excluded for a while
    (moved off the node, process recovery turned off, or the node's deviced left the mode)."""

    def __init__(self, grace_node: Callable[[str], bool], registry: CollectorRegistry | None = None) -> None:
        self.grace_node = grace_node
        self._excluded: dict[str, str] = {}  # job id -> the grace node it was logged with
        self.count = Counter(
            "faultmesh_brain_grace_exclusions",
            "Jobs with process-level recovery placed on a graceful-tolerance node: handled by Job-level "
            "rescheduling instead (logged once per job)",
            registry=registry or CollectorRegistry(),
        )

    def node_of(self, job) -> str | None:
        """The first node (in pod-rank order) of ``job`` in graceful-tolerance mode when the job has
        process-level recovery, else None (the job runs its process-level flow as usual)."""
        node = None
        if process_level_recovery(job.process_recover_enable, job.recover_strategy):
            node = next((n for n in job.nodes() if self.grace_node(n)), None)
        if node is None:
            self._excluded.pop(job.id, None)
        elif job.id not in self._excluded:
            self._excluded[job.id] = node
            self.count.inc()
            event(
                log, logging.WARNING, "process-level recovery excluded", job=job.id, node=node,
                reason="graceful tolerance on the node", fallback="job-rescheduling",
            )  # fmt: skip
        return node

    def forget(self, job_id: str) -> None:
        """A deleted job: drop its mark."""
        self._excluded.pop(job_id, None)
