"""The ``Recover`` service (no proto package): clusterd.md §2.1, §4, §7.

Codes: 0 OK · 400 UnRegistry · 402 JobNotExist · 403 ProcessRecoverEnableOff · 408 UnInit · 411
OMIsRunning · 413 OMParamInvalid · 500 OutOfMaxServeJobs · 502 OperatePodGroupError (the job
cannot be resolved) · 504 SignalQueueBusy (a report slot still full after ``report_s``) · 599
ServerInnerError (a report waiting on a full slot when the controller reset: "chan closed").
Streams of an unknown/unregistered job end with a gRPC error (status UNKNOWN, as a Go handler's
error shows). Info strings are the reference's
(component/clusterd/pkg/application/recover/fault_recover_service.go), its "registed" spelling too.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from faultmesh._pb import recover_pb2, recover_pb2_grpc
from faultmesh.log import event
from faultmesh.runtime import wait_for

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry
    from clusterd.brain.registry import RecoveryRegistry

log = logging.getLogger("clusterd.brain.recover")

MAX_SERVED_JOBS = 10_000
STRESS_OPS = (0, 1)  # 0 AIC, 1 P2P
# SubscribeNotifySwitch / SubscribeNotifyExecStressTest before the job registered (om_service.go)
UNREGISTERED_NOTIFY = (grpc.StatusCode.UNKNOWN, "jobId={} not registed, please wait agent register")
REPORT_RPCS = {
    "stop": "ReportStopComplete",
    "strategy": "ReportRecoverStrategy",
    "status": "ReportRecoverStatus",
}


def _st(code: int, info: str) -> recover_pb2.Status:
    return recover_pb2.Status(code=code, info=info)


class RecoverServicer(recover_pb2_grpc.RecoverServicer):
    """Recover RPCs over the job registry ``jobs`` and the recovery ``registry`` (Inits and one
    controller per registered job); ``decide(job, flow, decision, reason)`` records a decision,
    ``process_fault(job, ranks)`` takes a ReportProcessFault, ``super_pod_id(job, node)`` places a
    node, ``reject(reason)`` counts a refused request, ``report_s`` is the report timeout (s)."""

    def __init__(
        self,
        jobs: JobRegistry,
        registry: RecoveryRegistry,
        decide: Callable[..., Any],
        process_fault: Callable[[str, list], Awaitable[Any]],
        super_pod_id: Callable[[Any, str], int],
        reject: Callable[[str], None],
        report_s: float,
    ) -> None:
        self.jobs = jobs
        self.registry = registry
        self.decide = decide
        self.process_fault = process_fault
        self.super_pod_id = super_pod_id
        self.reject = reject
        self.report_s = report_s

    def _reject(self, reason: str, code: int, info: str) -> recover_pb2.Status:
        self.reject(reason)
        event(log, logging.INFO, "recover request rejected", code=code, info=info)
        return _st(code, info)

    # -- init / register ---------------------------------------------------------------------------
    async def Init(self, request, context):  # noqa: N802
        """0 (also when already initialised) · 502 unknown job · 403 process recovery off."""
        jid = request.jobId
        if jid in self.registry.initialised:
            return _st(0, f"job(uid={jid}) init success")  # fault_recover_service.go Init
        job = self.jobs.get(jid)
        if job is None:
            return self._reject("unknown_job", 502, f"job(uid={jid}) one of jobName, pgName, ns is empty")
        if job.process_recover_enable != "on" and job.sub_healthy_strategy != "hotSwitch":
            return self._reject(
                "recover_off",
                403,
                f"job(uid={jid}) process-recover-enable and subhealthy hotswtich not open:<nil>",
            )
        try:
            await self.registry.mark_initialised(jid)
        except (sqlite3.Error, OSError) as e:  # not stored: not initialised; the client retries Init
            return self._reject("state_write", 500, f"job(uid={jid}) init failed: state write failed: {e}")
        event(log, logging.INFO, "role[%s] init success" % (request.role or "-"), job=jid)
        return _st(0, f"job(uid={jid}) init success")

    async def Register(self, request, context):  # noqa: N802
        """0 (also when already registered) · 408 not initialised · 402 unknown job · 500 too many jobs."""
        jid = request.jobId
        if jid in self.registry.controllers:
            return _st(0, "register success")
        if jid not in self.registry.initialised:
            return self._reject("uninit", 408, f"jobId={jid} not inited")
        if self.jobs.get(jid) is None:
            return self._reject("unknown_job", 402, f"jobId={jid} not exist, reuse registry")
        if len(self.registry.controllers) >= MAX_SERVED_JOBS:
            return self._reject("max_jobs", 500, f"out of max serve jobs, reuse registry for jobId={jid}")
        await self.registry.register(jid)
        return _st(0, "register success")

    def _ctl(self, jid: str):
        return self.registry.controllers.get(jid)

    async def SubscribeProcessManageSignal(self, request, context):  # noqa: N802
        """Stream of ProcessManageSignal (keep-alive every 5 s); gRPC error when not registered."""
        ctl = self._ctl(request.jobId)
        if ctl is None:
            self.reject("unregistered")
            await context.abort(grpc.StatusCode.UNKNOWN, f"jobId={request.jobId} not registed")
        event(log, logging.INFO, "signal subscription", job=request.jobId, role=request.role)
        async for sig in ctl.stream(request.jobId):
            yield sig

    # -- reports -----------------------------------------------------------------------------------
    async def _report(self, kind: str, jid: str, request, context):
        ctl = self._ctl(jid)
        if ctl is None:
            return self._reject("unregistered", 400, f"jobId={jid} not registed")
        rpc = REPORT_RPCS.get(kind)  # om_service.go's replies answer "reply success"
        # the info's uuid is the one of the call's start (the reference formats it before the send)
        info = f"jobId={jid}, uuid={ctl.uuid}, receive {rpc}" if rpc else "reply success"
        code = await ctl.io.report(kind, request)
        if code == 599:  # catchAndSetExceptionInfo: the send hit a channel closed by a reset
            return _st(599, f"jobId={jid}, uuid={ctl.uuid}, chan closed")
        if code != 0:
            return _st(code, "report queue busy")
        return _st(0, info)

    async def ReportStopComplete(self, request, context):  # noqa: N802
        """400 not registered · 0 once queued: a full slot makes the call wait for the flow (599 on a
        reset meanwhile, 504 after ``report_s``; :meth:`clusterd.brain.channel.SignalChannel.report`)."""
        return await self._report("stop", request.jobId, request, context)

    async def ReportRecoverStrategy(self, request, context):  # noqa: N802
        """400 not registered · 0."""
        return await self._report("strategy", request.jobId, request, context)

    async def ReportRecoverStatus(self, request, context):  # noqa: N802
        """400 not registered · 0."""
        return await self._report("status", request.jobId, request, context)

    async def ReportProcessFault(self, request, context):  # noqa: N802
        """400 not registered · else 0; ranks with type "1" (or retry ranks) start the recovery."""
        ctl = self._ctl(request.jobId)
        if ctl is None:
            return self._reject("unregistered", 400, f"jobId={request.jobId} not registed")
        ctl.io.client_answered()
        await self.process_fault(request.jobId, list(request.faultRanks))
        return _st(0, "receive ReportProcessFault")

    async def HealthCheck(self, request, context):  # noqa: N802
        """Always 0 ``jobId=<id>, receive HeathCheck`` (the reference's spelling)."""
        return _st(0, f"jobId={request.jobId}, receive HeathCheck")

    # -- NIC switch (§4.1) -------------------------------------------------------------------------
    def _job_checks(self, jid: str) -> str | None:
        job = self.jobs.get(jid)
        if job is None:
            return f"job:{jid} not exist"
        if jid not in self.registry.controllers:
            return f"job:{jid} is not registered"
        if job.status != "running":
            return f"job:{jid} is not running"
        return None

    async def SwitchNicTrack(self, request, context):  # noqa: N802
        """413 invalid (reason text) · 411 a flow runs · 0 ``switching operation was successfully distributed``."""
        jid = request.jobID
        why = self._job_checks(jid)
        if why is None and not request.nicOps:
            why = "nicOps is empty"
        ranks: list[str] = []
        ops: list[bool] = []
        job = self.jobs.get(jid)
        if why is None:
            for node in sorted(request.nicOps):
                dl = request.nicOps[node]
                on_node = {r.device_id: r for r in job.ranks_on(node)}
                if not on_node:
                    why = f"node:{node} not exist in job:{jid}"
                    break
                if len(dl.dev) != len(dl.op):
                    why = "dev and op length is not equal"
                    break
                if not dl.dev:
                    why = "dev or op is empty"
                    break
                bad = [d for d in dl.dev if not d.isdigit() or int(d) not in on_node]
                if bad:
                    why = f"device:{bad[0]} not exist in node:{node}"
                    break
                if len(set(dl.dev)) != len(dl.dev):  # faultmesh's own check (the reference has none)
                    why = f"node:{node} devices should not repeat"
                    break
                if self.super_pod_id(job, node) < 0:
                    why = f"node:{node} should operate in superPodID"
                    break
                for d, o in zip(dl.dev, dl.op, strict=True):
                    ranks.append(str(on_node[int(d)].rank))
                    ops.append(bool(o))
        if why is not None:
            return self._reject("om_param_invalid", 413, why)
        ctl = self._ctl(jid)
        if ctl.busy() or ctl.state != "INIT":
            return self._reject("om_running", 411, f"jobId={jid} nic is swtiching, or job recovering")
        ctl.start_om("nic")  # visible at once to SubscribeSwitchNicSignal
        ctl.start_flow("switch-nic", lambda: ctl.om.nic_switch(ranks, ops))
        self.decide(jid, "switch-nic", "start", f"ranks {','.join(ranks)} op {ops}")
        return _st(0, "switching operation was successfully distributed")

    async def _om_reply(self, jid: str, kind: str, context):
        ctl = self._ctl(jid)
        if ctl is None:
            self.reject("unregistered")
            await context.abort(grpc.StatusCode.UNKNOWN, f"jobId={jid} not registed")
        if ctl.io.om_reply is None or (ctl.st.om_kind != kind and not ctl.io.om_reply.done()):
            self.reject("no_om")
            what = "is not swtiching nic" if kind == "nic" else "is not stress test"
            await context.abort(grpc.StatusCode.UNKNOWN, f"jobId={jid} {what}")
        fut = ctl.io.om_reply
        try:
            msg = await wait_for(asyncio.shield(fut), self.report_s * 4 + 60)
        except TimeoutError:
            msg = "om failed, no result"
        if ctl.io.om_reply is fut:
            ctl.io.om_reply = None  # one message per operation
        return msg

    async def SubscribeSwitchNicSignal(self, request, context):  # noqa: N802
        """One SwitchNicResponse with the outcome of the running (or just finished) switch."""
        msg = await self._om_reply(request.jobID, "nic", context)
        yield recover_pb2.SwitchNicResponse(jobID=request.jobID, msg=msg)

    async def SubscribeNotifySwitch(self, request, context):  # noqa: N802
        """The training side's stream of SwitchRankList; gRPC error when not registered."""
        ctl = self._ctl(request.jobId)
        if ctl is None:
            await context.abort(UNREGISTERED_NOTIFY[0], UNREGISTERED_NOTIFY[1].format(request.jobId))
        async for m in ctl.io.notify_stream("nic"):
            yield m

    async def ReplySwitchNicResult(self, request, context):  # noqa: N802
        """413 no job id · 400 not registered · 0."""
        if not request.jobId:
            return self._reject("om_param_invalid", 413, "jobId is empty")
        return await self._report("switch", request.jobId, request, context)

    # -- stress test (§4.2) ------------------------------------------------------------------------
    async def StressTest(self, request, context):  # noqa: N802
        """413 invalid · 411 a flow runs · 0."""
        jid = request.jobID
        job = self.jobs.get(jid)
        why = None
        if job is None:
            why = f"job:{jid} not exist"
        elif jid not in self.registry.controllers:
            why = f"job:{jid} is not registered"
        params: dict[str, dict[str, list[int]]] = {}
        if why is None:
            if request.allNodesOps:
                why = _ops_error(list(request.allNodesOps), "AllNodes")
                node_ops = {n: list(request.allNodesOps) for n in job.nodes()}
            elif not request.stressParam:
                why = "stress test node is nil"
            else:
                node_ops = {}
                for node in sorted(request.stressParam):
                    ops = list(request.stressParam[node].ops)
                    if not ops:
                        why = f"node:{node} stress test ops is 0"
                        break
                    if not job.ranks_on(node):
                        why = f"node:{node} not exist in job:{jid}"
                        break
                    why = _ops_error(ops, node)
                    if why:
                        break
                    node_ops[node] = ops
            if why is None:
                params = {n: {str(r.rank): ops for r in job.ranks_on(n)} for n, ops in node_ops.items()}
        if why is not None:
            return self._reject("om_param_invalid", 413, why)
        ctl = self._ctl(jid)
        if ctl.busy() or ctl.state != "INIT":
            return self._reject("om_running", 411, f"jobId={jid} om is running, or job recovering")
        ctl.start_om("stress")
        ctl.start_flow("stress-test", lambda: ctl.om.stress_test(params))
        self.decide(jid, "stress-test", "start", f"nodes {sorted(params)}")
        return _st(0, "stress test operation was successfully distributed")

    async def SubscribeStressTestResponse(self, request, context):  # noqa: N802
        """One StressTestResponse with the outcome of the running (or just finished) stress test."""
        msg = await self._om_reply(request.jobID, "stress", context)
        yield recover_pb2.StressTestResponse(jobID=request.jobID, msg=msg)

    async def SubscribeNotifyExecStressTest(self, request, context):  # noqa: N802
        """The training side's stream of StressTestRankParams; gRPC error when not registered."""
        ctl = self._ctl(request.jobId)
        if ctl is None:
            await context.abort(UNREGISTERED_NOTIFY[0], UNREGISTERED_NOTIFY[1].format(request.jobId))
        async for m in ctl.io.notify_stream("stress"):
            yield m

    async def ReplyStressTestResult(self, request, context):  # noqa: N802
        """400 not registered (an empty job id too) · else 0, an empty result included (the
        reference's answer; the flow then finds no op result)."""
        return await self._report("stress", request.jobId, request, context)


def _ops_error(ops: list[int], node: str) -> str | None:
    """The reference's validateStressTestOps texts (om_service.go); ``node`` is "AllNodes" for
    allNodesOps."""
    bad = next((o for o in ops if o not in STRESS_OPS), None)
    if bad is not None:
        supported = " ".join(str(o) for o in sorted(STRESS_OPS))
        return f"op:{bad} not exist in support operation:[{supported}]"
    if len(set(ops)) != len(ops):
        return f"node:{node} stress test ops should not repeat"
    return None
