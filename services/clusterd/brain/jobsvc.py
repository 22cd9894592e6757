"""``job.Job`` (job summaries) and ``config.Config`` (rank tables): clusterd.md §2.5, §2.6.

job.Job:
- Register: role in CCAgent / DefaultUser1 / DefaultUser2 / FdAgent, else 400 as a gRPC error;
  at most 100000 clients (429); success 200 with a new UUID ``clientId``.
- Subscribe RPCs need a registered clientId with that role (gRPC error otherwise), at most 20
  active subscriptions per role and one shared limiter (20/s, burst 20) for both subscribe RPCs.
  Each client has a 10-message buffer; a full buffer drops the message (counted). A job with more
  than 40000 ranks gets an empty HcclJson. SubscribeJobSummarySignalList first sends every job in
  batches of <= 40000 NPUs, then each update as a one-element list (JobTotalNum=1);
  SubscribeJobSummarySignal only streams updates.

Both: registrations are bounded per caller and expire without a stream
(:mod:`clusterd.brain.registrations`; 429 beyond the per-caller cap).

config.Config (MindIE's global rank table, :mod:`clusterd.brain.mindie`; the reference's
application/config/grpc_service.go and domain/epranktable/ranktable_manager.go):
- Register 0 ``register success``; the publisher is keyed by jobId (the MindIE job id; the
  role is not part of the key) and replaces an older one, whose stream ends. At most
  :data:`MAX_UNKNOWN_JOB_REGS` registrations for jobs that do not exist (429 beyond: the reference
  has no cap and always answers 0).
- SubscribeRankTable needs that publisher (else gRPC UNKNOWN ``jobId=<id> not registered,
  role=<role>``); it asks for a regeneration the way the reference's rate-limited queue runs it:
  first after 2 s, a failed one (not ready, not registered) again 4 s later, then given up. A change
  of a member job (label jobID) regenerates at once, retried after 2 s and 4 s. Every table built is
  sent (queued up to 1000 while no stream is open); a job that is no MindIE service gets none. The
  stream ends with the publisher, which is then removed (subscribe again after a new Register).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import orjson

from clusterd.brain import mindie
from clusterd.brain.registrations import Registrations, caller_of
from faultmesh._pb import config_pb2, config_pb2_grpc, job_pb2, job_pb2_grpc
from faultmesh.log import event
from faultmesh.ratelimit import TokenBucket

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry

log = logging.getLogger("clusterd.brain.job")

ROLES = ("CCAgent", "DefaultUser1", "DefaultUser2", "FdAgent")
MAX_CLIENTS = 100_000
MAX_SUBS_PER_ROLE = 20
CLIENT_BUFFER = 10
MAX_RANKS_HCCL = 40_000
BATCH_NPUS = 40_000
MAX_UNKNOWN_JOB_REGS = 1024  # config.Config registrations for jobs that do not exist (yet)


# job.Job statuses as the reference names them (StatusJobCompleted is "complete").
SUMMARY_STATUS = {"completed": "complete"}


def summary_status(job, operator: str) -> str:
    """The summary's jobStatus: the reference's pending / running / complete / failed; a deleted job
    that did not complete is ``failed`` (PreDeleteCmAndCache)."""
    status = SUMMARY_STATUS.get(job.status, job.status)
    if operator == "delete" and status != "complete":
        return "failed"
    return status


def summary_rank_table(job, node_ip: Callable[[str], str]) -> dict:
    """The HcclJson of a summary (the reference's RankTable): ``server_id`` and ``host_ip`` are the host
    IP (:func:`clusterd.brain.mindie.host_ip`: the pod's ``hostIp``, else the node's; FD-OL reads the
    servers' IPs from it), ``server_name`` the node, status ``complete``."""
    servers = []
    for node in job.nodes():
        ip = mindie.host_ip(job, node, node_ip)
        servers.append(
            {
                "server_id": ip or node,
                "host_ip": ip,
                "server_name": node,
                "device": [
                    {"device_id": str(r.device_id), "rank_id": str(r.rank)} for r in job.ranks_on(node)
                ],
            }
        )
    return {"status": "complete", "version": "1.0", "server_count": str(len(servers)), "server_list": servers}


def summary(job, operator: str, node_ip: Callable[[str], str] = lambda node: "") -> job_pb2.JobSummarySignal:
    """A JobSummarySignal for ``job``; ``operator`` is ``add`` (new or changed job) or ``delete``
    (the reference sends no other). ``deleteTime`` (s) is set once the job is complete, failed or
    deleted; ``masterAddr`` is the IP of the first server (pod rank 0); ``node_ip(node)`` -> IP or ""."""
    status = summary_status(job, operator)
    table = "" if len(job.ranks) > MAX_RANKS_HCCL else orjson.dumps(summary_rank_table(job, node_ip)).decode()
    ended = operator == "delete" or status in ("complete", "failed")
    end_s = int(time.time()) if operator == "delete" else job.updated_ms // 1000
    return job_pb2.JobSummarySignal(
        uuid=str(uuid.uuid4()),
        jobId=job.id,
        jobName=job.name,
        namespace=job.namespace,
        frameWork=job.framework,
        jobStatus=status,
        time=str(job.created_ms // 1000),
        cmIndex="0",
        total="1",
        HcclJson=table,
        deleteTime=str(end_s) if ended else "",
        masterAddr=mindie.host_ip(job, job.nodes()[0], node_ip) if job.ranks else "",
        operator=operator,
        sid=job.id,
    )


def report_time() -> str:
    """JobSummarySignalList.ReportTime: now in milliseconds (the reference's unit)."""
    return str(time.time_ns() // 1_000_000)


class JobServicer(job_pb2_grpc.JobServicer):
    """job.Job (module docstring) over the job registry ``jobs``; ``node_info(node)`` gives a
    node's IP, ``reject(reason)`` counts a refused request."""

    def __init__(
        self, jobs: JobRegistry, node_info: Callable[[str], dict[str, Any]], reject: Callable[[str], None]
    ) -> None:
        self.jobs = jobs
        self.node_info = node_info
        self.reject = reject
        self.clients: dict[str, str] = {}  # clientId -> role
        self.subs: dict[str, tuple[str, asyncio.Queue]] = {}  # clientId -> (role, queue)
        self._limiter = TokenBucket(20.0, 20.0)
        self.regs = Registrations(lambda cid: self.clients.pop(cid, None))

    def _node_ip(self, node: str) -> str:
        return self.node_info(node).get("node_ip", "")

    async def Register(self, request, context):  # noqa: N802
        """See the module docstring."""
        if request.role not in ROLES:
            self.reject("job_bad_role")
            await context.abort(grpc.StatusCode.UNKNOWN, f"code 400: role {request.role!r} not allowed")
        self.regs.prune()
        if len(self.clients) >= MAX_CLIENTS:
            self.reject("job_max_clients")
            return job_pb2.Status(code=429, info=f"more than {MAX_CLIENTS} clients")
        caller = caller_of(context)
        if self.regs.full(None, caller):
            self.reject("job_max_per_caller")
            return job_pb2.Status(code=429, info=f"more than {self.regs.max_per_caller} clients of {caller}")
        cid = str(uuid.uuid4())
        self.clients[cid] = request.role
        self.regs.add(cid, caller)
        event(log, logging.INFO, f"role[{request.role}] job register success", client=cid)
        return job_pb2.Status(code=200, info="register success", clientId=cid)

    def broadcast(self, job, operator: str) -> None:
        """Queue a one-job update to every subscriber (drops when a client's buffer is full)."""
        if not self.subs:
            return
        sig = summary(job, operator, self._node_ip)
        for _, (kind, q) in list(self.subs.items()):
            item = sig if kind == "one" else job_pb2.JobSummarySignalList(
                jobSummarySignals=[sig], ReportTime=report_time(), JobTotalNum=1
            )  # fmt: skip
            try:
                q.put_nowait(item)
            except asyncio.QueueFull:
                self.reject("job_client_full")

    async def _subscribe(self, request, context, kind: str):
        cid = request.clientId
        self.regs.prune()
        role = self.clients.get(cid)
        if role is None or role != request.role:
            self.reject("job_unregistered")
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"clientId {cid!r} with role {request.role!r} not registered"
            )
        if not self._limiter.take():
            self.reject("job_rate")
            await context.abort(grpc.StatusCode.UNKNOWN, "subscribe rate limited")
        active = sum(1 for c in self.subs if self.clients.get(c) == role)
        if cid not in self.subs and active >= MAX_SUBS_PER_ROLE:
            self.reject("job_max_subs")
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"more than {MAX_SUBS_PER_ROLE} subscriptions of role {role}"
            )
        q: asyncio.Queue = asyncio.Queue(maxsize=CLIENT_BUFFER)
        old = self.subs.get(cid)
        if old is not None:
            _end(old[1])
        self.subs[cid] = (kind, q)
        self.regs.opened(cid)  # a client with an open stream never expires
        return cid, q

    async def SubscribeJobSummarySignal(self, request, context):  # noqa: N802
        """Stream of JobSummarySignal updates."""
        cid, q = await self._subscribe(request, context, "one")
        try:
            while (item := await q.get()) is not None:
                yield item
        finally:
            self.regs.closed(cid)
            if cid in self.subs and self.subs[cid][1] is q:
                del self.subs[cid]

    async def SubscribeJobSummarySignalList(self, request, context):  # noqa: N802
        """Every job first (batches of <= 40000 NPUs), then one-element updates."""
        cid, q = await self._subscribe(request, context, "list")
        try:
            jobs = self.jobs.all()
            batch: list = []
            npus = 0
            for job in jobs:
                if batch and npus + len(job.ranks) > BATCH_NPUS:
                    yield job_pb2.JobSummarySignalList(
                        jobSummarySignals=batch, ReportTime=report_time(), JobTotalNum=len(jobs)
                    )
                    batch, npus = [], 0
                batch.append(summary(job, "add", self._node_ip))
                npus += len(job.ranks)
            if batch:
                yield job_pb2.JobSummarySignalList(
                    jobSummarySignals=batch, ReportTime=report_time(), JobTotalNum=len(jobs)
                )
            while (item := await q.get()) is not None:
                yield item
        finally:
            self.regs.closed(cid)
            if cid in self.subs and self.subs[cid][1] is q:
                del self.subs[cid]


# config.Config: the reference's rank-table queue (constant.QueueInitDelay, MaxRetryTime) and
# publisher buffer (application/config/publisher.go chanBufferSize).
RANKTABLE_INIT_DELAY_S = 2.0
RANKTABLE_MAX_RETRY = 3
RANKTABLE_BUFFER = 1000


class ConfigServicer(config_pb2_grpc.ConfigServicer):
    """config.Config (module docstring) over the job registry ``jobs``; ``node_info(node)`` gives a
    node's IP, ``spawn(coro, name)`` runs an owned task, ``reject(reason)`` counts a refused request."""

    def __init__(
        self,
        jobs: JobRegistry,
        node_info: Callable[[str], dict[str, Any]],
        spawn: Callable[..., asyncio.Task],
        reject: Callable[[str], None],
    ) -> None:
        self.jobs = jobs
        self.node_info = node_info
        self.spawn = spawn
        self.reject = reject
        self.pubs: dict[str, asyncio.Queue] = {}  # MindIE job id -> its publisher's queue
        self._now: set[str] = set()  # job ids with an immediate regeneration pending (a burst is one)
        self.regs = Registrations(self._drop)
        self._unknown: set[str] = set()  # job ids registered while no member job existed

    def _drop(self, mid: str) -> None:
        q = self.pubs.pop(mid, None)
        self._unknown.discard(mid)
        if q is not None:
            _end(q)

    def _known(self, mid: str) -> bool:
        return any(j.mindie_job_id == mid or j.id == mid for j in self.jobs.all())

    def _unknown_full(self) -> bool:
        if len(self._unknown) < MAX_UNKNOWN_JOB_REGS:
            return False
        self._unknown = {m for m in self._unknown if m in self.pubs and not self._known(m)}
        return len(self._unknown) >= MAX_UNKNOWN_JOB_REGS

    async def Register(self, request, context):  # noqa: N802
        """0; replaces the jobId's publisher (its stream ends). 429 over the per-caller cap or the cap
        of registrations for jobs that do not exist (module docstring)."""
        event(log, logging.INFO, "business config service receive Register request",
              jobId=request.jobId, role=request.role)  # fmt: skip
        mid = request.jobId
        self.regs.prune()
        caller = caller_of(context)
        if self.regs.full(mid, caller):
            self.reject("config_max_per_caller")
            return config_pb2.Status(
                code=429, info=f"more than {self.regs.max_per_caller} registrations of {caller}"
            )
        unknown = not self._known(mid)
        if unknown and mid not in self._unknown and self._unknown_full():
            self.reject("config_unknown_jobs")
            return config_pb2.Status(
                code=429, info=f"more than {MAX_UNKNOWN_JOB_REGS} registrations for jobs that do not exist"
            )
        self._drop(mid)
        self.pubs[mid] = asyncio.Queue(maxsize=RANKTABLE_BUFFER)
        self.regs.add(mid, caller)
        if unknown:
            self._unknown.add(mid)
        return config_pb2.Status(code=0, info="register success")

    def publish(self, job) -> None:
        """A member job of a MindIE service changed (or was deleted): regenerate its table now."""
        mid = job.mindie_job_id
        if mid and mid not in self._now:
            self._now.add(mid)
            self.spawn(self._generate(mid, 0), name=f"ranktable-{mid}")

    async def _generate(self, mid: str, failures: int) -> None:
        """The reference's queue item: ``failures`` = its NumRequeues; delays 2 s x 2^(n-1)."""
        delay = 0.0 if failures == 0 else RANKTABLE_INIT_DELAY_S * 2 ** (failures - 1)
        while True:
            await asyncio.sleep(delay)
            if failures == 0:
                self._now.discard(mid)  # a change from now on needs a new table
            if self._push(mid):
                return
            delay = RANKTABLE_INIT_DELAY_S * 2**failures
            failures += 1
            if failures >= RANKTABLE_MAX_RETRY:
                event(log, logging.WARNING, "global rank table given up", jobId=mid, tries=failures)
                return

    def _push(self, mid: str) -> bool:
        try:
            table = mindie.global_rank_table(self.jobs.all(), mid, self._node_ip)
        except mindie.NotReady as e:
            self.reject("ranktable_not_ready")
            event(log, logging.INFO, "global rank table not ready", jobId=mid, reason=str(e))
            return False
        q = self.pubs.get(mid)
        if q is None:
            self.reject("config_unregistered")
            event(log, logging.WARNING, "push global rank table failed: job not registered", jobId=mid)
            return False
        try:
            q.put_nowait(config_pb2.RankTableStream(jobId=mid, rankTable=orjson.dumps(table).decode()))
        except asyncio.QueueFull:
            self.reject("config_subscriber_full")
            return False
        event(log, logging.INFO, "ranktable changed", jobId=mid)
        return True

    def _node_ip(self, node: str) -> str:
        return self.node_info(node).get("node_ip", "")

    async def SubscribeRankTable(self, request, context):  # noqa: N802
        """Queued and new global rank tables of the jobId; gRPC error without Register."""
        self.regs.prune()
        q = self.pubs.get(request.jobId)
        if q is None:
            self.reject("config_unregistered")
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"jobId={request.jobId} not registered, role={request.role}"
            )
        self.spawn(self._generate(request.jobId, 1), name=f"ranktable-{request.jobId}")
        self.regs.opened(request.jobId)  # an open stream never expires
        try:
            while (item := await q.get()) is not None:
                yield item
        finally:
            if self.pubs.get(request.jobId) is q:
                del self.pubs[request.jobId]
                self.regs.remove(request.jobId)
                self._unknown.discard(request.jobId)


def _end(q: asyncio.Queue) -> None:
    while not q.empty():
        q.get_nowait()
    q.put_nowait(None)
