"""``TrainingDataTrace``: the lightweight-profiling (data-trace) switch (clusterd.md §2.2, §3).

faultmesh keeps the switch of each job (``namespace/jobName``) in the state file, streams it to
``SubscribeDataTraceSwitch`` subscribers, sends it to the job's nodes (agent control
``data_trace``) and writes it as the file ``<root>/<ns>.data-trace-<job>/profilingSwitch`` that
training containers mount (the reference's ConfigMap ``data-trace-<job>``, mounted at
``/user/cluster-info/datatrace-config``). ``root`` is ``--data-trace-dir``.

Codes (profiling's own): Modify: bad ``jobNsName`` -> 300 + gRPC error; unknown job -> 500
``notify subscribe failed`` + gRPC error; file write failure -> 500 + gRPC error; in Kubernetes
mode a failed ``data-trace-<job>`` write (:mod:`clusterd.kube.datatracecm`) -> 500 ``failed to
update comfigmap:[ns/job]`` + gRPC error, the switch staying stored (the reference's); success 200
``successfully changed profiling marker enable status``. Get: bad name -> 300 (no error); no
switch stored -> 404 + gRPC error; corrupt file -> 500 + gRPC error; success 200
``successfully get the status of job[ns/name]``. Subscribe: unknown job -> gRPC error
``jobId=.. not registered``; a new subscriber replaces the old one; only later changes are sent.
Values are not checked (any string is stored); an omitted field becomes "".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import orjson

from faultmesh._pb import agent_pb2, profiling_pb2, profiling_pb2_grpc
from faultmesh.files import atomic_write
from faultmesh.log import event

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry
    from clusterd.store import Store

log = logging.getLogger("clusterd.brain.datatrace")

FIELDS = ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader")
MAX_PUBLISHERS = 10_000
BAD_NAME = "the format of jobNsName is not namespace/jobName"


class DataTraceError(Exception):
    """A Modify that failed: ``code`` (300/500) and the message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class DataTraceWriteError(DataTraceError, OSError):
    """The profilingSwitch file could not be written (code 500; also an ``OSError``)."""


def split_ns_name(job_ns_name: str) -> tuple[str, str] | None:
    """``namespace/jobName`` -> (ns, name); None unless it splits into exactly two non-empty parts."""
    parts = job_ns_name.split("/")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


def switch_path(root: str | Path, namespace: str, name: str) -> Path:
    """``<root>/<ns>.data-trace-<job>/profilingSwitch``."""
    return Path(root) / f"{namespace}.data-trace-{name}" / "profilingSwitch"


class DataTrace(profiling_pb2_grpc.TrainingDataTraceServicer):
    """The switch store, file writer and the TrainingDataTrace servicer: over the job registry
    ``jobs`` and the ``store``; ``send(node, agent, **message)`` reaches an agent,
    ``reject(reason)`` counts a refused request; switch files under ``root``."""

    NS = "datatrace"

    def __init__(
        self,
        jobs: JobRegistry,
        store: Store,
        send: Callable[..., Awaitable[bool]],
        reject: Callable[[str], None],
        root: str,
    ) -> None:
        self.jobs = jobs
        self.store = store
        self.send = send
        self.reject = reject
        self.root = root
        self.pubs: dict[str, asyncio.Queue] = {}  # job id -> subscriber queue
        # after each stored change: sink(ns, job, switch); Kubernetes mode writes data-trace-<job>
        # (clusterd.kube.datatracecm); a sink raises DataTraceError to fail the Modify
        self.sinks: list[Callable[[str, str, dict[str, str]], Awaitable[None]]] = []
        self._lock = asyncio.Lock()

    async def set_switch(self, job_ns_name: str, switch: dict[str, str]) -> None:
        """Store, write and publish a switch (all five fields; missing ones become ""), then hand it
        to the ``sinks`` (Kubernetes mode: the ``data-trace-<job>`` ConfigMap).

        Raises :class:`DataTraceError` (300 bad name, 500 unknown job, file or ConfigMap write
        failure; a failed ConfigMap write leaves the switch stored, as the reference does)."""
        parsed = split_ns_name(job_ns_name)
        if parsed is None:
            raise DataTraceError(300, BAD_NAME)
        ns, name = parsed
        job = self.jobs.by_ns_name(ns, name)
        if job is None:
            raise DataTraceError(500, "notify subscribe failed")
        value = {f: str(switch.get(f, "") or "") for f in FIELDS}
        async with self._lock:
            try:
                await asyncio.to_thread(write_switch, switch_path(self.root, ns, name), orjson.dumps(value))
            except OSError as e:
                event(log, logging.ERROR, "data-trace file write failed", job=job_ns_name, error=e)
                raise DataTraceWriteError(500, f"failed to write profilingSwitch: {e}") from None
            await self.store.kv_put(self.NS, job_ns_name, value)
        q = self.pubs.get(job.id)
        if q is not None:
            res = profiling_pb2.DataStatusRes(
                message="update profiling switch",
                code=200,
                profilingSwitch=profiling_pb2.ProfilingSwitch(**value),
            )
            try:
                q.put_nowait(res)
            except asyncio.QueueFull:
                self.reject("datatrace_subscriber_full")
        msg = switch_message(job_ns_name, value)
        for node in job.nodes():
            await self.send(node, "noded", data_trace=msg)
        event(log, logging.INFO, "data-trace switch changed", job=job_ns_name, **value)
        for sink in self.sinks:
            await sink(ns, name, value)

    async def on_agent_connect(self, node: str, agent: str) -> None:
        """A noded (re)connected: send it the stored switch of every job with ranks on its node, so
        a restarted or newly placed noded rewrites the host files it missed (issue 29)."""
        if agent != "noded":
            return
        for job in self.jobs.jobs_on_node(node):
            job_ns_name = f"{job.namespace}/{job.name}"
            value = await self.store.kv_get(self.NS, job_ns_name)
            if isinstance(value, dict):
                await self.send(node, "noded", data_trace=switch_message(job_ns_name, value))

    async def get_switch(self, job_ns_name: str) -> dict[str, str] | None:
        """The stored switch of ``namespace/jobName`` or None."""
        return await self.store.kv_get(self.NS, job_ns_name)

    # -- RPCs --------------------------------------------------------------------------------------
    async def ModifyTrainingDataTraceSwitch(self, request, context):  # noqa: N802
        """See the module docstring."""
        sw = request.profilingSwitch
        try:
            await self.set_switch(request.jobNsName, {f: getattr(sw, f) for f in FIELDS})
        except DataTraceError as e:
            self.reject(f"datatrace_{e.code}")
            await context.abort(grpc.StatusCode.UNKNOWN, str(e))
        return profiling_pb2.DataTypeRes(
            message="successfully changed profiling marker enable status", code=200
        )

    async def GetTrainingDataTraceSwitch(self, request, context):  # noqa: N802
        """See the module docstring."""
        parsed = split_ns_name(request.jobNsName)
        if parsed is None:
            return profiling_pb2.DataStatusRes(message=BAD_NAME, code=300)
        value = await self.get_switch(request.jobNsName)
        if value is None:
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"failed to found configmap:[{parsed[0]}/data-trace-{parsed[1]}]"
            )
        path = switch_path(self.root, *parsed)
        try:
            raw = await asyncio.to_thread(path.read_bytes)
            value = orjson.loads(raw)
            if not isinstance(value, dict):
                raise ValueError("not an object")
        except FileNotFoundError:
            pass  # the stored value stands (the file is rewritten on the next change)
        except (OSError, ValueError) as e:
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"profilingSwitch of {request.jobNsName} is corrupt: {e}"
            )
        return profiling_pb2.DataStatusRes(
            message=f"successfully get the status of job[{request.jobNsName}]",
            code=200,
            profilingSwitch=profiling_pb2.ProfilingSwitch(**{f: str(value.get(f, "")) for f in FIELDS}),
        )

    async def SubscribeDataTraceSwitch(self, request, context):  # noqa: N802
        """Stream of later switch changes of jobId (no snapshot first)."""
        jid = request.jobId
        if self.jobs.get(jid) is None or (jid not in self.pubs and len(self.pubs) >= MAX_PUBLISHERS):
            self.reject("datatrace_unregistered")
            await context.abort(grpc.StatusCode.UNKNOWN, f"jobId={jid} not registered")
        old = self.pubs.get(jid)
        if old is not None:  # the older stream ends
            while not old.empty():
                old.get_nowait()
            old.put_nowait(None)
        q: asyncio.Queue = asyncio.Queue(maxsize=100)
        self.pubs[jid] = q
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                yield item
        finally:
            if self.pubs.get(jid) is q:
                del self.pubs[jid]


def write_switch(path: Path, data: bytes) -> None:
    """Blocking: write a profilingSwitch file atomically (folder created). Raises ``OSError``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def switch_message(job_ns_name: str, value: dict[str, str]) -> agent_pb2.DataTraceSwitch:
    """The ``data_trace`` control message of a switch (the five FIELDS)."""
    return agent_pb2.DataTraceSwitch(
        job_ns_name=job_ns_name,
        communication_operator=value["CommunicationOperator"],
        step=value["Step"],
        save_checkpoint=value["SaveCheckpoint"],
        fp=value["FP"],
        data_loader=value["DataLoader"],
    )
