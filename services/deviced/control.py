"""Control messages for deviced: ``job`` (JobInfo from clusterd) -> the chips in use (engine, §3.3
PreSeparateNPU keeps a used chip Healthy) and the job's reset-config files (with whether the job
has process-level recovery, which excludes graceful tolerance: :mod:`faultmesh.exclusions`); ``release`` (an
operator's release through clusterd's authenticated API) -> :func:`release_device`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from deviced.engine import FaultEngine
from deviced.sinks.resetcfg import ResetConfigWriter
from faultmesh._pb import agent_pb2
from faultmesh.exclusions import process_level_recovery
from faultmesh.log import event

log = logging.getLogger("deviced")


class JobControl:
    """Tracks the ranks each job places on ``node`` (rank -> physical id, in ``jobs_ranks``)."""

    def __init__(
        self, node: str, engine: FaultEngine, writer: ResetConfigWriter | None, wake: Callable[[], None]
    ) -> None:
        self.node = node
        self.engine = engine
        self.writer = writer
        self.wake = wake
        self.jobs_ranks: dict[str, dict[int, int]] = {}

    async def on_control(self, msg: agent_pb2.ControlMessage) -> None:
        """Handle one ControlMessage; kinds other than ``job`` are ignored."""
        if msg.WhichOneof("body") != "job":
            return
        job = msg.job
        ranks = {r.rank: r.device_id for r in job.ranks if r.node == self.node}
        gone = job.deleted or not ranks
        if gone:
            self.jobs_ranks.pop(job.job_id, None)
        else:
            self.jobs_ranks[job.job_id] = ranks
        if self.writer is not None:
            process_level = process_level_recovery(job.process_recover_enable, job.recover_strategy)
            self.writer.set_job(job.job_id, job.name, job.namespace, ranks, gone, process_level)
        used_phy = {phy for rs in self.jobs_ranks.values() for phy in rs.values()}
        self.engine.set_in_use(logic for logic, d in self.engine.devices.items() if d.ids.phy in used_phy)
        event(log, logging.INFO, "job update", job=job.job_id, ranks_here=len(ranks), deleted=job.deleted)
        self.wake()


def release_device(
    engine: FaultEngine, phy: int, changed: Callable[[], None], seen_until_ms: int = 0
) -> bool | None:
    """Drop the ManuallySeparateNPU escalations of the chip with physical id ``phy`` (reference
    deviced.md §4.2 "Operator deletion") raised at or before ``seen_until_ms`` (ms; 0: all -- the
    ``ReleaseDevice`` message's field: what the operator saw, so a release delivered twice leaves a
    separation raised in between alone), then ``changed()`` (report + save). Returns whether
    something was released, None for an unknown chip."""
    logic = engine.logic_of_phy(phy)
    if logic is None:
        event(log, logging.WARNING, "release of an unknown chip ignored", phy_id=phy)
        return None
    released = engine.release_manual(logic, seen_until_ms)
    event(log, logging.WARNING, "manual separation released by operator", phy_id=phy, released=released,
          seen_until_ms=seen_until_ms)  # fmt: skip
    changed()
    return released
