"""Per-job ``reset-config`` files for graceful fault tolerance (reference deviced.md §5.2, §6).

For each job using this node's chips (jobs arrive from clusterd as ``JobInfo`` control messages), the
directory ``<reset_dir>/<namespace>.reset-config-<job name>/`` holds ``reset.json``, ``restartType``
and ``checkCode`` (sha256 of reset.json), which the training container mounts. Every write is atomic
(:func:`faultmesh.files.atomic_write`) and happens only when the content (UpdateTime aside) changed.

``reset.json``: ``{RankList:[{RankId, LogicId, PhyId, Status: unrecovered|recovered, Policy,
InitialPolicy, ErrorCode: [], ErrorCodeHex: "A,B", FaultLevel}], UpdateTime: <unix s>, RetryTime: 0,
FaultFlushing: false, GracefulExit: 0, RestartFaultProcess: false}``. Policy strings by level
(§3.1): RestartRequest restart_request, RestartBusiness restart, FreeRestartNPU free_reset,
RestartNPU reset, PreSeparate/Separate/ManuallySeparate isolate, others empty.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from faultmesh.files import atomic_write
from faultmesh.levels import NpuLevel
from faultmesh.log import event

log = logging.getLogger("deviced.resetcfg")

POLICY = {
    NpuLevel.NotHandleFault: "",
    NpuLevel.SubHealthFault: "",
    NpuLevel.RestartRequest: "restart_request",
    NpuLevel.RestartBusiness: "restart",
    NpuLevel.FreeRestartNPU: "free_reset",
    NpuLevel.RestartNPU: "reset",
    NpuLevel.PreSeparateNPU: "isolate",
    NpuLevel.SeparateNPU: "isolate",
    NpuLevel.ManuallySeparateNPU: "isolate",
}


def policy_of(level: NpuLevel | None) -> str:
    """The graceful-reset policy string of a level ('' for none)."""
    return POLICY.get(level, "") if level is not None else ""


@dataclass
class JobOnNode:
    """A job's ranks on this node: ``ranks`` maps rank id -> physical device id."""

    job_id: str
    name: str
    namespace: str
    ranks: dict[int, int] = field(default_factory=dict)
    initial: dict[int, str] = field(default_factory=dict)  # rank -> first policy seen
    listed: set[int] = field(default_factory=set)  # ranks that were ever faulty
    last_body: str = ""

    @property
    def dirname(self) -> str:
        return f"{self.namespace or 'default'}.reset-config-{self.name or self.job_id}"


@dataclass(frozen=True)
class ChipFault:
    """What the writer needs about one chip: ids, the worst level and the active codes (hex)."""

    logic: int
    phy: int
    level: NpuLevel | None
    codes: tuple[str, ...]


def chips_of(engine) -> dict[int, ChipFault]:
    """What the writer needs of a :class:`deviced.engine.FaultEngine`: physical id -> ChipFault."""
    return {
        d.ids.phy: ChipFault(
            logic, d.ids.phy, d.worst_level(), tuple(engine.table.spelling(c) for c in sorted(d.codes()))
        )
        for logic, d in engine.devices.items()
    }


class ResetConfigWriter:
    """Keeps one reset-config directory per job under ``root``. ``restart_type`` is hotReset or
    podReschedule. Write errors are logged and counted in ``errors``, never raised."""

    def __init__(self, root: str | os.PathLike, restart_type: str = "podReschedule") -> None:
        self.root = Path(root)
        self.restart_type = restart_type
        self.jobs: dict[str, JobOnNode] = {}
        self.errors = 0
        self.writes = 0

    def set_job(self, job_id: str, name: str, namespace: str, ranks: dict[int, int], deleted: bool) -> None:
        """Add, update or (``deleted``) remove a job; a removed job's directory is deleted."""
        if deleted:
            job = self.jobs.pop(job_id, None)
            if job is not None:
                shutil.rmtree(self.root / job.dirname, ignore_errors=True)
                event(log, logging.INFO, "reset config removed", job=job_id, dir=job.dirname)
            return
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = JobOnNode(job_id, name, namespace)
        job.name, job.namespace, job.ranks = name, namespace, dict(ranks)

    def used_phy_ids(self) -> set[int]:
        """Physical ids of chips any known job uses."""
        return {phy for j in self.jobs.values() for phy in j.ranks.values()}

    def update(self, chips_by_phy: dict[int, ChipFault]) -> int:
        """Rewrite the files of every job whose content changed. Returns the number of files written."""
        n = 0
        for job in self.jobs.values():
            ranks = []
            for rank, phy in sorted(job.ranks.items()):
                chip = chips_by_phy.get(phy)
                pol = policy_of(chip.level) if chip else ""
                if pol:
                    job.listed.add(rank)
                    job.initial.setdefault(rank, pol)
                if rank not in job.listed:
                    continue
                ranks.append(
                    {
                        "RankId": rank,
                        "LogicId": chip.logic if chip else -1,
                        "PhyId": phy,
                        "Status": "unrecovered" if pol else "recovered",
                        "Policy": pol,
                        "InitialPolicy": job.initial.get(rank, pol),
                        "ErrorCode": [],
                        "ErrorCodeHex": ",".join(chip.codes) if chip and pol else "",
                        "FaultLevel": chip.level.name if chip and chip.level is not None and pol else "",
                    }
                )
            doc = {
                "RankList": ranks,
                "RetryTime": 0,
                "FaultFlushing": False,
                "GracefulExit": 0,
                "RestartFaultProcess": False,
            }
            body = json.dumps(doc, sort_keys=True)
            if body == job.last_body:
                continue
            doc["UpdateTime"] = int(time.time())
            data = json.dumps(doc, sort_keys=True, indent=1).encode()
            d = self.root / job.dirname
            try:
                d.mkdir(parents=True, exist_ok=True)
                atomic_write(d / "reset.json", data)
                atomic_write(d / "restartType", self.restart_type.encode())
                atomic_write(d / "checkCode", hashlib.sha256(data).hexdigest().encode())
            except OSError as e:
                self.errors += 1
                event(log, logging.ERROR, "reset config write failed", job=job.job_id, error=str(e))
                continue
            job.last_body = body
            self.writes += 1
            n += 1
            event(
                log, logging.INFO, "reset config written", job=job.job_id, dir=job.dirname, ranks=len(ranks)
            )
        return n
