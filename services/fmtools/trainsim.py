"""trainsim: a stand-in for TaskD / MindIO of one training job, talking to ClusterD's Recover service.

It calls Init and Register, opens SubscribeProcessManageSignal, SubscribeNotifySwitch and
SubscribeNotifyExecStressTest, and answers every signal the way the training side does
(clusterd.md §4, §7.3), with outcomes chosen by :class:`Outcomes`:

=====================  =====================================================================
signal                 answer
=====================  =====================================================================
preExitProcess         TaskD stops the fault ranks' workers and reports them: ReportProcessFault
                       with every fault rank as type "1" (``process_fault``)
stopTrain              ReportStopComplete, status ``stop`` (ok 0, fail 499, notready 404)
globalFault            ReportRecoverStrategy with ``strategies`` (and the fault ranks)
changeStrategy X       ReportRecoverStatus with ``status[X]`` (default 0); none for ``exit``
saveAndExit            ReportRecoverStatus with ``status["dump"]``
hot-switch             on ``new pod running``: ReportRecoverStrategy with ``strategies``
faultNodesExit         ReportRecoverStatus 0 (a pod that exited at the globalFault: an error)
killMaster             recorded; the simulator stops when ``exit_on_kill``
SwitchRankList         ReplySwitchNicResult(result = ``switch`` == ok)
StressTestRankParams   ReplyStressTestResult, each op ``stress_codes.get(rank, stress_code)``
=====================  =====================================================================

What the real clients would reject or misread is checked by :class:`fmtools.trainchecks.ClientChecks`
(its module docstring lists each check): such a signal *fails loudly* (a ``client-error`` event,
:attr:`TrainSim.errors`) and is not answered.

With ``mindio_wait_s`` (MINDIO_WAIT_MINDX_TIME), a flow that sends no ``changeStrategy`` within
that time after the stop is an error too (MindIO's controller gives up and the job fails).

Any answer set to ``silent`` is never sent (a client that vanishes mid-flow). Every event is kept
in :attr:`TrainSim.events` (and printed as a JSON line by the CLI).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from faultmesh._pb import recover_pb2, recover_pb2_grpc
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for
from fmtools.trainchecks import GO_TASKD, ClientChecks, ClientStreamBroken

SILENT = "silent"
STOP_CODES = {"ok": 0, "fail": 499, "notready": 404}


@dataclass
class Outcomes:
    """How the simulated training side answers (module docstring)."""

    stop: str = "ok"  # ok | fail | notready | silent
    strategies: list[str] | None = field(default_factory=lambda: ["retry", "recover", "dump", "exit"])
    status: dict[str, int | str] = field(default_factory=dict)  # strategy -> code or "silent"
    default_status: int | str = 0
    switch: str = "ok"  # ok | fail | silent
    stress_code: str = "0"  # "0".."4" or silent
    stress_codes: dict[str, str] = field(default_factory=dict)  # rank -> code
    delay_s: float = 0.0
    exit_on_kill: bool = False
    process_fault: str = "ok"  # ok | silent: the ReportProcessFault after preExitProcess
    mindio_wait_s: float = 0.0  # MINDIO_WAIT_MINDX_TIME: MindIO gives up without a strategy (0: never)


class TrainSimError(RuntimeError):
    """Init or Register was refused (the message has the code and info)."""


class TrainSim:
    """One simulated training job (module docstring). ``run()`` until :meth:`stop` or killMaster."""

    def __init__(
        self,
        target: str,
        job_id: str,
        outcomes: Outcomes | None = None,
        role: str = "taskd",
        token: str | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        reconnect: bool = False,
        ranks_per_pod: int = 0,
        credentials: grpc.ChannelCredentials | None = None,
        backoff_max_s: float = 5.0,
        channel_options: list[tuple[str, str]] | None = None,
    ) -> None:
        self.target = target
        self.credentials = credentials  # TLS to ClusterD's gRPC port (None: plaintext)
        self.channel_options = channel_options or []  # e.g. the TLS target name override
        self.backoff_max_s = backoff_max_s  # the longest wait between reconnects (s, >= 0.5)
        self.job_id = job_id
        self.o = outcomes or Outcomes()
        self.role = role
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.on_event = on_event
        self.reconnect = reconnect
        self._inited = False  # Init answered 0 once (TaskD's manager never calls it again)
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self.stub: recover_pb2_grpc.RecoverStub | None = None
        self._fault_ranks: list = []  # the last signal's fault ranks (isolated on a 201 answer)
        self._mindio_watch: asyncio.Task | None = None  # MINDIO_WAIT_MINDX_TIME after the stop
        # what TaskD / MindIO would reject or misread; ranks_per_pod: NPUs per pod (0: unknown)
        self.checks = ClientChecks(job_id, role, ranks_per_pod, self._record)

    @property
    def errors(self) -> list[str]:
        """What the real TaskD / MindIO would reject or misread (:attr:`ClientChecks.errors`)."""
        return self.checks.errors

    # -- events ------------------------------------------------------------------------------------
    def _record(self, kind: str, **data: Any) -> None:
        ev = {"event": kind, "t": round(time.time(), 3), **data}
        self.events.append(ev)
        self._changed.set()
        if self.on_event:
            self.on_event(ev)

    def signals(self, signal_type: str | None = None) -> list[dict[str, Any]]:
        """Received signals (keep-alive excluded), optionally of one type."""
        return [e for e in self.events
                if e["event"] == "signal" and signal_type in (None, e["signalType"])]  # fmt: skip

    async def wait_for(self, pred: Callable[[list[dict[str, Any]]], Any], timeout_s: float = 10.0) -> Any:
        """Wait until ``pred(events)`` is truthy; returns it. Raises ``TimeoutError``."""
        async with asyncio.timeout(timeout_s):
            while True:
                res = pred(self.events)
                if res:
                    return res
                self._changed.clear()
                await self._changed.wait()

    # -- lifecycle ---------------------------------------------------------------------------------
    async def connect(self) -> None:
        """Open the channel, Init and Register. Raises :class:`TrainSimError` on a non-zero code
        (and ``grpc.aio.AioRpcError``, e.g. UNAVAILABLE from a clusterd follower); after a failure
        the channel is closed. Role ``taskd`` skips Init once one succeeded (see :meth:`run`)."""
        self._channel = (
            grpc.aio.secure_channel(self.target, self.credentials, options=self.channel_options)
            if self.credentials
            else grpc.aio.insecure_channel(self.target)
        )
        self.stub = recover_pb2_grpc.RecoverStub(self._channel)
        info = recover_pb2.ClientInfo(jobId=self.job_id, role=self.role)
        # TaskD's Go manager (role taskd; manager.go subscribeProcessManageSignal) calls Init once per
        # process and on every later reconnect only Register; MindIO's client Inits each time
        calls = ("Register",) if self.role == "taskd" and self._inited else ("Init", "Register")
        try:
            for name in calls:
                st = await getattr(self.stub, name)(info, metadata=self.metadata, timeout=10)
                self._record(name.lower(), code=st.code, info=st.info)
                if st.code != 0:
                    raise TrainSimError(f"{name}: code {st.code}: {st.info}")
                if name == "Init":
                    self._inited = True
        except BaseException:
            await self.close()
            raise

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Connect (if needed), subscribe to the three streams and answer until stopped.

        With ``reconnect`` (TaskD's behaviour) a lost stream (ClusterD restarted or unreachable)
        is followed by Register (role ``taskd``: TaskD's manager Inits once per process; other roles
        Init again, as MindIO's client does) and new subscriptions, with back-off up to
        ``backoff_max_s`` (5 s)."""
        backoff = Backoff(0.5, max(0.5, self.backoff_max_s))
        try:
            while not self._stop.is_set():
                if self.stub is None:
                    try:
                        await self.connect()
                    except (TrainSimError, grpc.aio.AioRpcError) as e:
                        if not self.reconnect:
                            raise
                        self._record("reconnect-failed", error=str(e)[:200])
                        await self._sleep(backoff.next_delay())
                        continue
                backoff.reset()
                await self._serve(ready)
                if self._stop.is_set() or not self.reconnect:
                    return
                self._record("reconnecting")
                await self.close()
                await self._sleep(backoff.next_delay())
        finally:
            await self.close()

    async def _sleep(self, s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await wait_for(self._stop.wait(), s)

    async def _serve(self, ready: asyncio.Event | None) -> None:
        tasks = [
            asyncio.create_task(self._signals(ready)),
            asyncio.create_task(self._notify_switch()),
            asyncio.create_task(self._notify_stress()),
        ]
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([stop, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self._disarm_mindio()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t

    def stop(self) -> None:
        """Ask :meth:`run` to end."""
        self._stop.set()

    async def close(self) -> None:
        """Close the channel (all streams end: ClusterD sees the client vanish)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self.stub = None

    # -- streams -----------------------------------------------------------------------------------
    async def _signals(self, ready: asyncio.Event | None) -> None:
        info = recover_pb2.ClientInfo(jobId=self.job_id, role=self.role)
        call = self.stub.SubscribeProcessManageSignal(info, metadata=self.metadata)
        self._record("subscribed")
        if ready is not None:
            ready.set()
        try:
            async for sig in call:
                if sig.signalType == "keep-alive":
                    self._record("keep-alive")
                    continue
                self._record(
                    "signal",
                    signalType=sig.signalType,
                    actions=list(sig.actions),
                    changeStrategy=sig.changeStrategy,
                    faultRanks=[(f.rankId, f.faultType) for f in sig.faultRanks],
                    nodeRankIds=list(sig.nodeRankIds),
                    extraParams=sig.extraParams,
                    timeout=sig.timeout,
                    uuid=sig.uuid,
                )
                await self._answer(sig)
                if sig.signalType == "killMaster" and self.o.exit_on_kill:
                    self.stop()
                    return
        except ClientStreamBroken as e:
            call.cancel()
            self._record("stream-ended", code="CLIENT", details=str(e))
        except grpc.aio.AioRpcError as e:
            self._record("stream-ended", code=e.code().name, details=e.details())
        else:
            self._record("stream-ended", code="OK")

    async def _delay(self) -> None:
        if self.o.delay_s:
            await asyncio.sleep(self.o.delay_s)

    def _status_code(self, strategy: str) -> int | str:
        return self.o.status.get(strategy, self.o.default_status)

    def _arm_mindio(self) -> None:
        """MindIO's controller waits MINDIO_WAIT_MINDX_TIME after pausing for a strategy."""
        self._disarm_mindio()
        if self.o.mindio_wait_s > 0:
            self._mindio_watch = asyncio.create_task(self._mindio_gives_up())

    def _disarm_mindio(self) -> None:
        if self._mindio_watch is not None:
            self._mindio_watch.cancel()
            self._mindio_watch = None

    async def _mindio_gives_up(self) -> None:
        await asyncio.sleep(self.o.mindio_wait_s)
        msg = f"no changeStrategy within MINDIO_WAIT_MINDX_TIME ({self.o.mindio_wait_s}s): MindIO gives up"
        self.checks.error(msg)

    async def _answer(self, sig) -> None:
        st = sig.signalType
        if st == "changeStrategy":
            self._disarm_mindio()
        if st in ("stopTrain", "saveAndExit", "hot-switch"):
            self.checks.flow_uuid = sig.uuid  # ClusterD's flow, also when the client drops the signal
        if self.checks.client_drops(sig):
            return
        ranks = list(sig.faultRanks)
        if ranks:
            self._fault_ranks = ranks
        if self.checks.rejected(sig):
            return
        if st == "preExitProcess":
            if self.o.process_fault == SILENT:
                return
            await self._delay()
            code = await self.report_process_fault([(f.rankId, "1") for f in ranks])
            self._record("reply", rpc="ReportProcessFault", code=code)
        elif st == "stopTrain":
            if self.o.stop == SILENT:
                return
            await self._delay()
            code = STOP_CODES.get(self.o.stop, 0)
            got = await self._send(
                "ReportStopComplete",
                recover_pb2.StopCompleteRequest(
                    jobId=self.job_id, status=recover_pb2.Status(code=code), faultRanks=ranks
                ),
            )
            self._record("reply", rpc="ReportStopComplete", sent=code, code=got)
            if code == 0:
                self._arm_mindio()
        elif st == "globalFault" or (st == "hot-switch" and "new pod running" in sig.actions):
            await self._report_strategy(ranks)
        elif st in ("changeStrategy", "saveAndExit", "faultNodesExit"):
            strategy = {"saveAndExit": "dump", "faultNodesExit": "fault_nodes_exit"}.get(
                st, sig.changeStrategy
            )
            if strategy == "exit":
                return
            code = 0 if st == "faultNodesExit" else self._status_code(strategy)
            if code == SILENT:
                return
            await self._delay()
            # TaskD's Go manager sends MindIO's fault ranks as isolateRankIds with every status
            # (manager.go reportRecoverStatus); the Python client never sets them
            isolate = [f.rankId for f in self._fault_ranks] if self.role == GO_TASKD else []
            got = await self._send(
                "ReportRecoverStatus",
                recover_pb2.RecoverStatusRequest(
                    jobId=self.job_id,
                    status=recover_pb2.Status(code=int(code)),
                    strategy=strategy,
                    isolateRankIds=isolate,
                ),
            )
            self._record("reply", rpc="ReportRecoverStatus", strategy=strategy, sent=int(code), code=got)

    async def _report_strategy(self, ranks) -> None:
        if self.o.strategies is None:
            return
        await self._delay()
        got = await self._send(
            "ReportRecoverStrategy",
            recover_pb2.RecoverStrategyRequest(
                jobId=self.job_id, faultRanks=ranks, strategies=self.o.strategies
            ),
        )
        self._record("reply", rpc="ReportRecoverStrategy", strategies=list(self.o.strategies), code=got)

    async def _send(self, rpc: str, request) -> int:
        """One report as the client sends it; returns the (last) answer's code. TaskD's Go manager
        acts on no code; the Python client (recover_manager.py report_*) answers a non-zero code
        with Register and the report once more."""
        self.checks.answered_since = True
        r = await getattr(self.stub, rpc)(request, metadata=self.metadata)
        if r.code != 0 and self.role != GO_TASKD:
            self._record("report-again", rpc=rpc, code=r.code, info=r.info)
            await self.stub.Register(
                recover_pb2.ClientInfo(jobId=self.job_id, role=self.role), metadata=self.metadata
            )
            r = await getattr(self.stub, rpc)(request, metadata=self.metadata)
        return r.code

    async def report_status(self, code: int, strategy: str = "") -> int:
        """Send a ReportRecoverStatus by hand (e.g. 406: a fault during an O&M flow)."""
        return await self._send(
            "ReportRecoverStatus",
            recover_pb2.RecoverStatusRequest(
                jobId=self.job_id, status=recover_pb2.Status(code=code), strategy=strategy
            ),
        )

    async def report_process_fault(self, ranks: list[tuple[str, str]]) -> int:
        """ReportProcessFault with [(rankId, faultType)]."""
        return await self._send(
            "ReportProcessFault",
            recover_pb2.ProcessFaultRequest(
                jobId=self.job_id, faultRanks=[recover_pb2.FaultRank(rankId=a, faultType=b) for a, b in ranks]
            ),
        )

    async def _notify_switch(self) -> None:
        info = recover_pb2.ClientInfo(jobId=self.job_id, role=self.role)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for m in self.stub.SubscribeNotifySwitch(info, metadata=self.metadata):
                self._record("switch", ranks=list(m.rankID), ops=list(m.op))
                if self.o.switch == SILENT:
                    continue
                await self._delay()
                self.checks.answered_since = True
                r = await self.stub.ReplySwitchNicResult(
                    recover_pb2.SwitchResult(jobId=self.job_id, result=self.o.switch == "ok"),
                    metadata=self.metadata,
                )
                self._record("reply", rpc="ReplySwitchNicResult", result=self.o.switch == "ok", code=r.code)

    async def _notify_stress(self) -> None:
        info = recover_pb2.ClientInfo(jobId=self.job_id, role=self.role)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for m in self.stub.SubscribeNotifyExecStressTest(info, metadata=self.metadata):
                params = {rank: list(ol.ops) for rank, ol in m.stressParam.items()}
                self._record("stress", params=params)
                if self.o.stress_code == SILENT:
                    continue
                await self._delay()
                res = {}
                for rank, ops in params.items():
                    code = self.o.stress_codes.get(rank, self.o.stress_code)
                    res[rank] = recover_pb2.StressTestRankResult(
                        rankResult={
                            str(op): recover_pb2.StressTestOpResult(
                                code=code, result="ok" if code == "0" else "fail"
                            )
                            for op in ops
                        }
                    )
                self.checks.answered_since = True
                r = await self.stub.ReplyStressTestResult(
                    recover_pb2.StressTestResult(jobId=self.job_id, stressResult=res), metadata=self.metadata
                )
                self._record("reply", rpc="ReplyStressTestResult", code=r.code)
