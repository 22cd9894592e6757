"""Per-job ``reset-config`` files for graceful fault tolerance (reference deviced.md §5.2, §6).

For each job using this node's chips (jobs arrive from clusterd as ``JobInfo`` control messages), the
directory ``<reset_dir>/<namespace>.reset-config-<job name>/`` holds ``reset.json``, ``restartType``
and ``checkCode`` (sha256 of reset.json), which the training container mounts. Every write is atomic
(:func:`faultmesh.files.atomic_write`) and happens only when the content (UpdateTime aside) changed.

``reset.json``: ``{RankList:[{RankId, LogicId, PhyId, Status: unrecovered|recovered|failed, Policy,
InitialPolicy, ErrorCode: [], ErrorCodeHex: "A,B", FaultLevel}], UpdateTime: <unix s>, RetryTime: <int>,
FaultFlushing: false, GracefulExit: 0, RestartFaultProcess: false}``. Policy strings by level
(§3.1): RestartRequest restart_request, RestartBusiness restart, FreeRestartNPU free_reset,
RestartNPU reset, PreSeparate/Separate/ManuallySeparate isolate, others empty.

RetryTime is the job's count of device retries, which TaskD's ``fault_check`` compares with the
value it last acted on (``retry_time > pre_retry_time``: a retry happened). It is read back from an
existing file when a job is added (a deviced restart never lowers it) and raised by one only by
:meth:`ResetConfigWriter.write_ranks` with ``add_retry`` (the graceful-tolerance flow's first write
of a fault episode, :mod:`deviced.grace`; reference ``WriteResetInfoDataIntoCM(..., needAddRetry)``).

Two writers of the RankList: without graceful tolerance, :meth:`ResetConfigWriter.update` derives it
from the chips' levels each cycle; with it (``grace=True``), only the flow writes it
(:meth:`ResetConfigWriter.write_ranks`), as the reference's device plugin writes the reset
ConfigMap only from its graceful-tolerance flow; the job's file is created empty when the job comes.
"""

from __future__ import annotations

import argparse
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
    retry_time: int = 0  # RetryTime: device retries of this job (read back from an existing file)
    isolated: bool = False  # the last RankList written holds "isolate": the job is to be rescheduled
    process_level: bool = False  # the job has process-level recovery: no grace episode (deviced.grace)

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

    def __init__(
        self, root: str | os.PathLike, restart_type: str = "podReschedule", grace: bool = False
    ) -> None:
        self.root = Path(root)
        self.restart_type = restart_type
        self.grace = grace
        self.jobs: dict[str, JobOnNode] = {}
        self.errors = 0
        self.writes = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ResetConfigWriter | None:
        """The writer of deviced's flags (``--reset-config-dir``; None when unset): restartType hotReset
        with ``--hot-reset`` or ``--grace-tolerance`` (then in ``grace`` mode), else podReschedule."""
        if not args.reset_config_dir:
            return None
        grace = bool(args.grace_tolerance)
        return cls(args.reset_config_dir, "hotReset" if args.hot_reset or grace else "podReschedule", grace)

    def set_job(
        self,
        job_id: str,
        name: str,
        namespace: str,
        ranks: dict[int, int],
        deleted: bool,
        process_level: bool = False,
    ) -> None:
        """Add, update or (``deleted``) remove a job; a removed job's directory is deleted.
        ``process_level``: the job has process-level recovery (:mod:`faultmesh.exclusions`)."""
        if deleted:
            job = self.jobs.pop(job_id, None)
            if job is not None:
                shutil.rmtree(self.root / job.dirname, ignore_errors=True)
                event(log, logging.INFO, "reset config removed", job=job_id, dir=job.dirname)
            return
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = JobOnNode(job_id, name, namespace)
            job.name, job.namespace = name, namespace
            job.retry_time = self._read_retry_time(job)
            if self.grace:
                self._write(job, [], job.retry_time, created=True)
        if job.isolated and job.ranks and job.ranks != ranks:  # rescheduled: new placement, new episodes
            job.isolated = False
            event(log, logging.INFO, "reset config isolation cleared", job=job_id, reason="ranks changed")
        job.name, job.namespace, job.ranks = name, namespace, dict(ranks)
        job.process_level = process_level

    def _read_retry_time(self, job: JobOnNode) -> int:
        """RetryTime of the job's existing reset.json (0 when absent or unreadable)."""
        try:
            doc = json.loads((self.root / job.dirname / "reset.json").read_bytes())
        except (OSError, ValueError):
            return 0
        rt = doc.get("RetryTime") if isinstance(doc, dict) else None
        return rt if isinstance(rt, int) and not isinstance(rt, bool) and rt >= 0 else 0

    def used_phy_ids(self) -> set[int]:
        """Physical ids of chips any known job uses."""
        return {phy for j in self.jobs.values() for phy in j.ranks.values()}

    def update(self, chips_by_phy: dict[int, ChipFault]) -> int:
        """Rewrite the files of every job whose content changed (none with ``grace``: the flow writes
        them). Returns the number of files written."""
        if self.grace:
            return 0
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
                    rank_entry(
                        rank,
                        phy,
                        chip,
                        pol,
                        job.initial.get(rank, pol),
                        "unrecovered" if pol else "recovered",
                    )
                )
            n += self._write(job, ranks, job.retry_time)
        return n

    def write_ranks(self, job_id: str, ranks: list[dict], add_retry: bool) -> bool:
        """Write the job's RankList ``ranks`` (entries of :func:`rank_entry`) now; ``add_retry`` raises
        RetryTime by one (a new fault episode) and sets restartType hotReset. Refused (False, logged)
        for an unknown job, and once the last RankList held ``isolate`` while ``ranks`` is not empty
        (the job is to be rescheduled; reference ``WriteResetInfoDataIntoCM``); False on a write error."""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        if job.isolated and ranks:
            event(
                log,
                logging.WARNING,
                "reset config write refused",
                job=job_id,
                reason="isolate written: reschedule",
            )
            return False
        retry = job.retry_time + 1 if add_retry else job.retry_time
        if add_retry:
            self.restart_type = "hotReset"
        if self._write(job, ranks, retry, force=True) == 0:
            return False
        job.retry_time = retry
        return True

    def _write(
        self, job: JobOnNode, ranks: list[dict], retry: int, force: bool = False, created: bool = False
    ) -> int:
        """Write the job's three files when the content (UpdateTime aside) changed or ``force``;
        ``created``: only when reset.json does not exist yet. Returns 1 when written, else 0."""
        doc = {
            "RankList": ranks,
            "RetryTime": retry,
            "FaultFlushing": False,
            "GracefulExit": 0,
            "RestartFaultProcess": False,
        }
        body = json.dumps(doc, sort_keys=True)
        d = self.root / job.dirname
        if (body == job.last_body and not force) or (created and (d / "reset.json").exists()):
            return 0
        doc["UpdateTime"] = int(time.time())
        data = json.dumps(doc, sort_keys=True, indent=1).encode()
        try:
            d.mkdir(parents=True, exist_ok=True)
            atomic_write(d / "reset.json", data)
            atomic_write(d / "restartType", self.restart_type.encode())
            atomic_write(d / "checkCode", hashlib.sha256(data).hexdigest().encode())
        except OSError as e:
            self.errors += 1
            event(log, logging.ERROR, "reset config write failed", job=job.job_id, error=str(e))
            return 0
        job.last_body = body
        job.isolated = any(r.get("Policy") == "isolate" for r in ranks)
        self.writes += 1
        event(
            log,
            logging.INFO,
            "reset config written",
            job=job.job_id,
            dir=job.dirname,
            ranks=len(ranks),
            retry_time=retry,
        )
        return 1


def rank_entry(rank: int, phy: int, chip: ChipFault | None, policy: str, initial: str, status: str) -> dict:
    """One RankList entry: the rank on chip ``phy`` (``chip``: its fault view, None when unknown),
    with ``policy`` / ``initial`` (policy strings) and ``status`` (unrecovered|recovered|failed). The
    codes and the level are listed while the chip has a policy of its own."""
    own = chip is not None and bool(policy_of(chip.level))
    return {
        "RankId": rank,
        "LogicId": chip.logic if chip else -1,
        "PhyId": phy,
        "Status": status,
        "Policy": policy,
        "InitialPolicy": initial,
        "ErrorCode": [],
        "ErrorCodeHex": ",".join(chip.codes) if own else "",
        "FaultLevel": chip.level.name if own and chip.level is not None else "",
    }
