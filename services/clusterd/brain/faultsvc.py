"""The ``fault.Fault`` service: fault subscription for platforms and inference controllers (clusterd.md §2.4).

- Register(ClientInfo{jobId, role}): empty role -> gRPC error; empty jobId = "-1" (whole cluster);
  500 once 10000 job ids have publishers; a jobId that is neither a job nor a multi-instance
  (MindIE) service with a job of app type ``role`` -> 402 as a gRPC error; otherwise the publisher
  for (jobId, role) is created or replaced (the old stream ends) -> 0. A MindIE service's
  subscriber (jobId = the service's ``jobID``, e.g. its controller with role
  ``mindie-ms-controller``) gets one message for the whole service: the faults of every job of
  the service, under the service's id (the reference's ``checkPublishFault``). Beyond the
  reference: at most :data:`~clusterd.brain.registrations.MAX_PER_CALLER` publishers per caller (500
  beyond), and a publisher without a stream expires (:mod:`clusterd.brain.registrations`).
- SubscribeFaultMsgSignal: needs that publisher (gRPC error otherwise). Pushes a FaultMsgSignal
  only when it differs from the last one sent for that job; "normal" once after the faults clear.
  A cluster subscriber gets one message per job, each with that job's id. Buffer 1000 (overflow is
  dropped and counted). The publisher is removed when the stream ends.
- GetFaultMsgSignal: token bucket 10/s burst 10 plus a wait queue of 50, over that -> 429 as a gRPC
  error. Empty jobId -> the whole-cluster view (recomputed at most every 3 s, jobId "-1", nodes
  sorted by IP). jobId length outside [8, 128] or CJK characters -> 409 as a gRPC error. Unknown job
  -> 200 with no signal. Otherwise 200 ``all info returned``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import orjson

from clusterd.brain import mindie
from clusterd.brain.faultview import node_fault_infos
from clusterd.brain.registrations import Registrations, caller_of
from faultmesh._pb import fault_pb2, fault_pb2_grpc
from faultmesh.log import event
from faultmesh.ratelimit import TokenBucket

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry
    from clusterd.center import FaultCenter
    from faultmesh.model import Change, Fault

log = logging.getLogger("clusterd.brain.fault")

CLUSTER = "-1"
MAX_JOB_IDS = 10_000
BUFFER = 1000
QUEUE_WAIT_S = 5.0  # how long a queued GetFaultMsgSignal waits for a token
MAX_WAITING = 50
CJK_RE = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")


def signal_from_dict(job_id: str, nodes: list[dict]) -> fault_pb2.FaultMsgSignal:
    """Build a FaultMsgSignal (new uuid) from :func:`node_fault_infos` output."""
    return fault_pb2.FaultMsgSignal(
        uuid=str(uuid.uuid4()),
        jobId=job_id,
        signalType="fault" if nodes else "normal",
        nodeFaultInfo=[
            fault_pb2.NodeFaultInfo(
                nodeName=n["nodeName"],
                nodeIP=n["nodeIP"],
                nodeSN=n["nodeSN"],
                faultLevel=n["faultLevel"],
                faultDevice=[fault_pb2.DeviceFaultInfo(**d) for d in n["faultDevice"]],
            )
            for n in nodes
        ],
    )


class _Publisher:
    __slots__ = ("job_id", "role", "queue", "last", "closed")

    def __init__(self, job_id: str, role: str) -> None:
        self.job_id = job_id
        self.role = role
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=BUFFER)
        self.last: dict[str, bytes] = {}  # job id -> content last sent
        self.closed = False


class FaultServicer(fault_pb2_grpc.FaultServicer):
    """fault.Fault (module docstring) over the job registry ``jobs`` and the fault center
    ``center``, to which it subscribes itself (its own sink ``fault-service``: a change of a job's
    nodes pushes that job's view); ``node_info(node)`` gives a node's IP and SN,
    ``hidden_nodes(job_id)`` the nodes whose stress-test codes the job's view hides, and
    ``reject(reason)`` counts a refused request."""

    def __init__(
        self,
        jobs: JobRegistry,
        center: FaultCenter,
        node_info: Callable[[str], dict[str, Any]],
        hidden_nodes: Callable[[str], set[str]],
        reject: Callable[[str], None],
    ) -> None:
        self.jobs = jobs
        self.center = center
        self.node_info = node_info
        self.hidden_nodes = hidden_nodes
        self.reject = reject
        self.pubs: dict[tuple[str, str], _Publisher] = {}
        self.regs = Registrations(self._drop)
        self._bucket = TokenBucket(10.0, 10.0)
        self._waiting = 0
        self._cluster_cache: tuple[float, fault_pb2.FaultMsgSignal] | None = None
        center.subscribe("fault-service", self._on_changes, resync=self._on_resync)
        jobs.listen(self._on_job)

    # -- inputs ------------------------------------------------------------------------------------
    def _on_changes(self, changes: Sequence[Change]) -> None:
        """Fault-center subscriber: push the view of every job on a changed node (nothing to do, and
        no job lookup per batch, while no platform subscribes)."""
        if not self.pubs:
            return
        nodes = {c.fault.node for c in changes}
        self.publish({j.id: j for n in nodes for j in self.jobs.jobs_on_node(n)}.values())

    def _on_resync(self, faults: list[Fault]) -> None:
        """Fell behind the fault center: push every job's view (unchanged ones are not sent)."""
        self.publish(self.jobs.all())

    def _on_job(self, job, deleted: bool) -> None:
        """Job-registry listener: a new or changed job's view."""
        if not deleted:
            self.publish([job])

    def subscribed(self, job_id: str, role: str) -> bool:
        """True when a publisher is registered for ``job_id`` with ``role`` (the reference's
        ``Publisher.IsSubscribed(topic, subscriber)``)."""
        return (job_id, role) in self.pubs

    def _drop(self, key: tuple[str, str]) -> None:
        """End and forget the publisher of ``key`` (expired or replaced)."""
        old = self.pubs.pop(key, None)
        if old is not None:
            old.closed = True
            _end(old.queue)

    # -- views -------------------------------------------------------------------------------------
    def job_nodes(self, job) -> list[dict]:
        """The job's nodeFaultInfo dicts (faults on its devices and its nodes)."""
        return self.jobs_nodes([job])

    def jobs_nodes(self, jobs) -> list[dict]:
        """The nodeFaultInfo dicts of ``jobs`` together (a MindIE service): faults on their devices
        and their nodes, each node once, in the jobs' node order."""
        hidden: set[str] = set()
        devs: set[tuple[str, int]] = set()
        nodes: dict[str, None] = {}
        for job in jobs:
            hidden |= self.hidden_nodes(job.id)
            devs.update((r.node, r.device_id) for r in job.ranks)
            nodes.update(dict.fromkeys(job.nodes()))

        def on_job(node, f) -> bool:
            if node in hidden and f.code in ("80818C05", "80818C06"):
                return False
            return f.device_type != "NPU" or f.device_id < 0 or (node, f.device_id) in devs

        return node_fault_infos(nodes, self.center.faults_of_node, self.node_info, on_job)

    def service_jobs(self, mindie_id: str, app: str = "") -> list:
        """The jobs of MindIE service ``mindie_id`` (of app type ``app`` when given)."""
        return [j for j in mindie.members(self.jobs.all(), mindie_id) if not app or j.app == app]

    def cluster_nodes(self) -> list[dict]:
        """Every node with faults, sorted by node IP (then name)."""
        info = self.node_info
        nodes = sorted(self.center.node_names(), key=lambda n: (info(n).get("node_ip", ""), n))
        return node_fault_infos(nodes, self.center.faults_of_node, info)

    # -- publishing --------------------------------------------------------------------------------
    def publish(self, jobs: Iterable) -> None:
        """Push the current view of ``jobs`` to their (and the cluster's) subscribers if it changed."""
        if not self.pubs:
            return
        services: set[str] = set()
        for job in jobs:
            self._push(job.id, (job.id, CLUSTER), lambda job=job: self.job_nodes(job))
            if job.mindie_job_id:
                services.add(job.mindie_job_id)
        for mid in services:  # a MindIE service's subscribers: the whole service under its id
            self._push(mid, (mid,), lambda mid=mid: self.jobs_nodes(self.service_jobs(mid)))

    def _push(self, sig_id: str, keys: tuple[str, ...], nodes_of) -> None:
        """Send ``nodes_of()`` as signal ``sig_id`` to the publishers of job ids ``keys`` whose last
        signal for ``sig_id`` differs."""
        targets = [p for (jid, _), p in self.pubs.items() if jid in keys]
        if not targets:
            return
        nodes = nodes_of()
        content = orjson.dumps(nodes)
        sig = None
        for p in targets:
            last = p.last.get(sig_id)
            if last == content or (last is None and not nodes):
                continue
            p.last[sig_id] = content
            sig = sig or signal_from_dict(sig_id, nodes)
            try:
                p.queue.put_nowait(sig)
            except asyncio.QueueFull:
                self.reject("fault_publisher_full")

    # -- RPCs --------------------------------------------------------------------------------------
    async def Register(self, request, context):  # noqa: N802
        """See the module docstring."""
        if not request.role:
            self.reject("fault_empty_role")
            await context.abort(grpc.StatusCode.UNKNOWN, "role is empty")
        jid = request.jobId or CLUSTER
        self.regs.prune()
        ids = {k[0] for k in self.pubs}
        if jid not in ids and len(ids) >= MAX_JOB_IDS:
            self.reject("fault_max_jobs")
            return fault_pb2.Status(code=500, info=f"more than {MAX_JOB_IDS} jobs subscribed")
        if jid != CLUSTER and self.jobs.get(jid) is None and not self.service_jobs(jid, request.role):
            self.reject("fault_unknown_job")
            await context.abort(grpc.StatusCode.UNKNOWN, f"code 402: jobId={jid} does not exist")
        key, caller = (jid, request.role), caller_of(context)
        if self.regs.full(key, caller):
            self.reject("fault_max_per_caller")
            return fault_pb2.Status(
                code=500, info=f"more than {self.regs.max_per_caller} publishers of {caller}"
            )
        self._drop(key)
        self.pubs[key] = _Publisher(jid, request.role)
        self.regs.add(key, caller)
        event(log, logging.INFO, f"role[{request.role}] fault register success", job=jid)
        return fault_pb2.Status(code=0, info="register success")

    async def SubscribeFaultMsgSignal(self, request, context):  # noqa: N802
        """Stream of FaultMsgSignal for the registered (jobId, role)."""
        jid = request.jobId or CLUSTER
        self.regs.prune()
        pub = self.pubs.get((jid, request.role))
        if pub is None or pub.closed:
            self.reject("fault_unregistered")
            await context.abort(grpc.StatusCode.UNKNOWN, f"jobId={jid} role={request.role} not registered")
        if jid == CLUSTER:
            self._initial(pub, [(j.id, [j]) for j in self.jobs.all()])
        elif (job := self.jobs.get(jid)) is not None:
            self._initial(pub, [(jid, [job])])
        else:  # a MindIE service
            self._initial(pub, [(jid, self.service_jobs(jid))])
        self.regs.opened((jid, request.role))
        try:
            while True:
                sig = await pub.queue.get()
                if sig is None:
                    return
                yield sig
        finally:
            if self.pubs.get((jid, request.role)) is pub:
                del self.pubs[(jid, request.role)]
                self.regs.remove((jid, request.role))

    def _initial(self, pub: _Publisher, groups) -> None:
        """Queue the current signal of each (signal id, jobs) group that has faults."""
        for sig_id, jobs in groups:
            nodes = self.jobs_nodes(jobs)
            if nodes:
                pub.last[sig_id] = orjson.dumps(nodes)
                pub.queue.put_nowait(signal_from_dict(sig_id, nodes))

    async def _admit(self) -> bool:
        if self._bucket.take():
            return True
        if self._waiting >= MAX_WAITING:
            return False
        self._waiting += 1
        try:
            deadline = time.monotonic() + QUEUE_WAIT_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                if self._bucket.take():
                    return True
            return False
        finally:
            self._waiting -= 1

    async def GetFaultMsgSignal(self, request, context):  # noqa: N802
        """See the module docstring."""
        if not await self._admit():
            self.reject("fault_rate")
            await context.abort(grpc.StatusCode.UNKNOWN, "code 429: request rate limited")
        jid = request.jobId
        if not jid:
            now = time.monotonic()
            if self._cluster_cache is None or now - self._cluster_cache[0] >= 3.0:
                self._cluster_cache = (now, signal_from_dict(CLUSTER, self.cluster_nodes()))
            return fault_pb2.FaultQueryResult(
                code=200, info="all info returned", faultSignal=self._cluster_cache[1]
            )
        if not 8 <= len(jid) <= 128 or CJK_RE.search(jid):
            self.reject("fault_bad_job_id")
            await context.abort(
                grpc.StatusCode.UNKNOWN, "code 409: jobId must be 8..128 characters without CJK"
            )
        job = self.jobs.get(jid)
        if job is None:
            return fault_pb2.FaultQueryResult(code=200, info=f"jobId={jid} not found")
        return fault_pb2.FaultQueryResult(
            code=200, info="all info returned", faultSignal=signal_from_dict(jid, self.job_nodes(job))
        )


def _end(q: asyncio.Queue) -> None:
    while not q.empty():
        q.get_nowait()
    q.put_nowait(None)
