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

It checks each payload as TaskD's manager and MindIO's controller use it, and *fails loudly*
(a ``client-error`` event, :attr:`TrainSim.errors`, and no answer: the real client would hang or
misbehave) where ClusterD sends what they would reject or misread:

- ``preExitProcess`` without faultRanks or nodeRankIds: TaskD stops no worker (its StopWorkers
  messages go to the agents of nodeRankIds); a fault rank on a pod not named is never stopped;
- ``globalFault`` with ``fault_nodes_exit`` / ``fault_nodes_restart``: faultRanks must be set and
  name every rank of the pods in nodeRankIds (MindIO's on_global_rank would treat a rank killed
  with its pod as healthy) — checked when ``ranks_per_pod`` is known; ``fault_nodes_exit`` with no
  nodeRankIds is valid (recover-in-place: every fault pod restarts its processes, no agent exits);
- ``hot-switch`` "hot switch": faultRanks name every rank of the fault pod (MindIO waits for them
  in the backup pod and rebuilds their communication groups; notifyPrepareHotSwitch);
- ``changeStrategy`` with ``fault_nodes_restart``: every pod in nodeRankIds has a fault rank
  (TaskD restarts the workers of those ranks);
- ``changeStrategy``: retry / recover / dump / downgrade / upgrade need faultRanks; recover,
  recover-in-place (restart workers), dump, downgrade and exit need nodeRankIds (TaskD restarts,
  exits or sends ExitAgent only to those pods);
- ``globalFault`` / ``changeStrategy`` must carry the uuid of the flow's stopTrain / saveAndExit
  (a check of ClusterD's own consistency, the reference reusing the flow's uuid: neither client
  passes a uuid on to MindIO; TaskD looks only at preExitProcess uuids).

What reaches MindIO depends on the client the ``role`` stands for (both read for issue "the same
codes, payloads, order and timing"):

- role ``taskd`` (the default): TaskD's Go manager (taskd/go/framework_backend/manager). It turns
  faultRanks into a rank -> type map with Go's ``strconv.Atoi`` (utils GetFaultRanksMapByList): a
  rank whose id or type is not a number is dropped (an error here). Its stop-train plugin
  (plugins/stoptrain/stop_train.go) forwards a ``stopTrain`` only once per signal type + actions
  until it sees a ``globalFault`` or ``changeStrategy`` while it holds the stream token (a
  ``preExitProcess`` releases the token without forgetting); a repeated ``stopTrain`` is dropped,
  and so is a ``preExitProcess`` whose uuid is the last one's. killMaster ends the job, so the next
  TaskD starts afresh. It keeps only the latest ClusterD command and its plugins read it once a
  second: a command followed within that tick (less 0.2 s of jitter) by another, with no answer of
  TaskD's between, may never reach MindIO (an error here). Report answers' codes are ignored (manager.go reportRecoverStatus and the
  others retry only on a gRPC error); ReportRecoverStatus always carries the fault ranks as
  isolateRankIds.
- any other role: the Python gRPC client (taskd/python/toolkit/recover_module/recover_manager.py,
  role "master agent" upstream) that drives MindIO's controller directly. It drops (an error here)
  a signal without actions and one whose jobId is not its own; a rankId or faultType that
  ``int()`` cannot parse raises out of its stream loop, which then subscribes again (Init,
  Register, a new stream: ClusterD resets the flow); it acts only on save_and_exit, stop_train,
  on_global_rank and change_strategy (a signal with none of them is an error here). A report
  answered non-zero is sent once more after a Register; ReportRecoverStatus carries no
  isolateRankIds.

TaskD's Go manager never looks at a signal's jobId (it does not even pass it on); only the Python
client compares it with its own.

With ``mindio_wait_s`` (MINDIO_WAIT_MINDX_TIME), a flow that sends no ``changeStrategy`` within
that time after the stop is an error too (MindIO's controller gives up and the job fails).

Any answer set to ``silent`` is never sent (a client that vanishes mid-flow). Every event is kept
in :attr:`TrainSim.events` (and printed as a JSON line by the CLI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from faultmesh._pb import recover_pb2, recover_pb2_grpc
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for

SILENT = "silent"
STOP_CODES = {"ok": 0, "fail": 499, "notready": 404}
GO_TASKD = "taskd"  # the role of TaskD's Go manager; any other role is the Python client
TASKD_TICK_S = 1.0  # TaskD's manager reads the latest ClusterD command once a second (manager.go Process)
TICK_JITTER_S = 0.2  # arrival jitter allowed on top (two signals sent a tick apart may arrive closer)
MGR_SIGNALS = ("keep-alive", "pauseStartAgent", "continueStartAgent")  # not a ClusterD command
PY_ACTIONS = ("save_and_exit", "stop_train", "on_global_rank", "change_strategy")  # its action_func_map


def go_atoi(s: str) -> int | None:
    """Go's ``strconv.Atoi``: an optional sign, then ASCII digits only; None where it errs."""
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    return int(s)


class ClientStreamBroken(Exception):
    """The Python client's signal loop raised (``int()`` of a rank): it subscribes again."""


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
    ) -> None:
        self.target = target
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
        self.ranks_per_pod = ranks_per_pod  # NPUs per pod (0: unknown, the pod checks are skipped)
        self.errors: list[str] = []  # what the real TaskD / MindIO would reject or misread
        self._flow_uuid = ""  # the uuid of the flow's stopTrain / saveAndExit / hot-switch
        self._exited: set[str] = set()  # pods told to exit at the flow's globalFault (fault_nodes_exit)
        self._mindio_watch: asyncio.Task | None = None  # MINDIO_WAIT_MINDX_TIME after the stop
        # TaskD's stop-train plugin: holds the stream token, what it forwarded, the last preExit uuid
        self._stop_token, self._stop_sent, self._stop_last_uuid = False, set(), ""
        # TaskD's 1 s tick: when the last ClusterD command came, and whether TaskD answered since
        self._last_cmd: tuple[str, float] | None = None
        self._answered_since = True
        self.taskd_tick_s = TASKD_TICK_S  # 0: the tick check is off (unit tests of other checks)

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
        self._channel = grpc.aio.insecure_channel(self.target)
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
        Init again, as MindIO's client does) and new subscriptions, with back-off up to 5 s."""
        backoff = Backoff(0.5, 5.0)
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

    def _fail(self, sig, why: str) -> bool:
        """Record what the real client would hit; True (the signal is not answered)."""
        msg = f"{sig.signalType}{' ' + sig.changeStrategy if sig.changeStrategy else ''}: {why}"
        self.errors.append(msg)
        self._record("client-error", error=msg)
        return True

    def _client_drops(self, sig) -> bool:
        """What the client does with ``sig`` before MindIO sees it (module docstring): True when it
        is not answered (an error recorded). Raises :class:`ClientStreamBroken` where the Python
        client's stream loop raises."""
        st, actions = sig.signalType, list(sig.actions)
        if self.role == GO_TASKD:
            if st == "killMaster":  # the job ends: the next TaskD starts with a fresh plugin
                self._stop_token, self._stop_sent, self._stop_last_uuid = False, set(), ""
                return False
            bad = [(f.rankId, f.faultType) for f in sig.faultRanks
                   if go_atoi(f.rankId) is None or go_atoi(f.faultType) is None]  # fmt: skip
            if bad:
                return self._fail(sig, f"faultRanks {bad} are not numbers: TaskD drops them (strconv.Atoi)")
            if not actions:
                return self._fail(sig, "no actions: MindIO's controller acts per action, on none")
            self._check_tick(sig)
            return self._stop_plugin_drops(sig)
        # the Python client, recover_manager.py __signal_pipe_line, in its order
        if st == "killMaster":
            return False
        if not actions:
            return self._fail(sig, "no actions: MindIO's client ignores the signal")
        if sig.jobId != self.job_id:
            return self._fail(sig, f"jobId {sig.jobId!r} is not {self.job_id!r}: MindIO's client discards it")
        try:
            for f in sig.faultRanks:
                int(f.rankId), int(f.faultType)
        except ValueError as e:
            self._fail(sig, f"faultRanks not parsed by int() ({e}): MindIO's client subscribes again")
            raise ClientStreamBroken(str(e)) from None
        if not set(actions) & set(PY_ACTIONS):
            return self._fail(sig, f"actions {actions}: none is registered in MindIO's client")
        return False

    def _check_tick(self, sig) -> None:
        """TaskD's manager keeps only the latest ClusterD command (storage ClusterInfos.Command)
        and its plugins read it once per 1 s tick: a command followed within the tick by another,
        with no answer of TaskD's between (an answer means a tick saw it), may never reach MindIO.
        Records an error then; the signal itself is still answered."""
        if sig.signalType in MGR_SIGNALS:
            return
        now = time.monotonic()
        last, self._last_cmd = self._last_cmd, (sig.signalType, now)
        answered, self._answered_since = self._answered_since, False
        if last is not None and not answered and now - last[1] < self.taskd_tick_s - TICK_JITTER_S:
            msg = (
                f"{sig.signalType} came {now - last[1]:.3f}s after {last[0]} with no answer between:"
                f" TaskD's manager reads one ClusterD command per {self.taskd_tick_s:g}s tick,"
                f" {last[0]} may never reach MindIO"
            )
            self.errors.append(msg)
            self._record("client-error", error=msg)

    def _stop_plugin_drops(self, sig) -> bool:
        """TaskD's stop-train plugin (stop_train.go Predicate, Handle, then PullMsg) on ``sig``:
        True when it drops a ``stopTrain`` or ``preExitProcess`` the flow needs answered."""
        st = sig.signalType
        if not self._stop_token:
            if st == "preExitProcess" and sig.uuid == self._stop_last_uuid:
                return self._fail(sig, "the last preExitProcess's uuid: TaskD's stop-train plugin ignores it")
            if st not in ("stopTrain", "preExitProcess"):
                return False  # not the plugin's: another plugin forwards it
            self._stop_token = True
        if st in ("globalFault", "changeStrategy"):  # release the token, forget what was sent
            self._stop_token = False
            self._stop_sent.clear()
        elif st == "preExitProcess":  # release the token (what was sent is kept), forward
            self._stop_token = False
            self._stop_last_uuid = sig.uuid
            return False
        key = st + json.dumps(list(sig.actions), separators=(",", ":"))  # HasSendMessages' key
        if key in self._stop_sent:
            if st == "stopTrain":
                return self._fail(
                    sig,
                    f"TaskD's stop-train plugin already forwarded {key} and saw no globalFault /"
                    " changeStrategy since: dropped, no ReportStopComplete",
                )
            return False
        self._stop_sent.add(key)
        return False

    def _pods_of(self, ranks) -> set[str]:
        return {str(int(f.rankId) // self.ranks_per_pod) for f in ranks if f.rankId.isdigit()}

    def _left_out(self, ranks, pods) -> list[str]:
        """The ranks of ``pods`` not in ``ranks`` (none checked while ``ranks_per_pod`` is unknown)."""
        named, n = {f.rankId for f in ranks}, self.ranks_per_pod
        return sorted((str(r) for p in pods if p.isdigit() and n for r in range(int(p) * n, (int(p) + 1) * n)
                       if str(r) not in named), key=int)  # fmt: skip

    def _rejected(self, sig) -> bool:
        """TaskD's / MindIO's view of ``sig`` (module docstring). True when it is not answered."""
        st, cs, actions = sig.signalType, sig.changeStrategy, set(sig.actions)
        ranks, pods = list(sig.faultRanks), set(sig.nodeRankIds)
        if st in ("stopTrain", "saveAndExit", "hot-switch"):  # each begins a flow (pause too)
            self._flow_uuid, self._exited = sig.uuid, set()
        elif st in ("globalFault", "changeStrategy") and self._flow_uuid and sig.uuid != self._flow_uuid:
            return self._fail(sig, f"uuid {sig.uuid} is not the flow's {self._flow_uuid}")
        if st == "preExitProcess":
            if not ranks or not pods:
                return self._fail(sig, "no faultRanks or nodeRankIds: TaskD stops no worker")
            if self.ranks_per_pod and not self._pods_of(ranks) <= pods:
                return self._fail(sig, f"fault ranks on pods {sorted(self._pods_of(ranks) - pods)} not named")
        exiting = actions & {"fault_nodes_exit", "fault_nodes_restart"}
        if st == "globalFault" and exiting:
            self._exited = pods if "fault_nodes_exit" in exiting else set()
            # fault_nodes_exit with no nodeRankIds is right when every fault pod restarts its
            # processes in place (TaskD exits no agent); MindIO still needs the fault ranks
            if not ranks or ("fault_nodes_restart" in exiting and not pods):
                return self._fail(sig, f"{sorted(exiting)} without nodeRankIds / faultRanks")
            if lost := self._left_out(ranks, pods):
                return self._fail(sig, f"ranks {lost} exit with their pod but are not in faultRanks")
        if st == "faultNodesExit" and (gone := sorted(pods & self._exited, key=lambda p: (len(p), p))):
            return self._fail(sig, f"pods {gone} exited at the globalFault already: TaskD exits them twice")
        if st == "hot-switch" and "hot switch" in actions:  # MindIO waits for every rank of the pod
            if lost := self._left_out(ranks, self._pods_of(ranks)):
                return self._fail(sig, f"ranks {lost} of the switched pod are not in faultRanks")
        if st == "changeStrategy":
            if cs in ("retry", "recover", "dump", "downgrade", "upgrade") and not ranks:
                return self._fail(sig, "empty faultRanks: MindIO recovers no rank")
            if cs in ("recover", "dump", "downgrade", "exit") and not pods:
                what = "restarts no worker" if "fault_nodes_restart" in actions else "exits no agent"
                return self._fail(sig, f"empty nodeRankIds: TaskD {what}")
            if "fault_nodes_restart" in actions and self.ranks_per_pod:
                idle = sorted(pods - self._pods_of(ranks), key=lambda p: (len(p), p))
                if idle:
                    return self._fail(sig, f"pods {idle} restart workers but have no fault rank")
        return False

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
        self.errors.append(msg)
        self._record("client-error", error=msg)

    async def _answer(self, sig) -> None:
        st = sig.signalType
        if st == "changeStrategy":
            self._disarm_mindio()
        if st in ("stopTrain", "saveAndExit", "hot-switch"):
            self._flow_uuid = sig.uuid  # ClusterD's flow, also when the client drops the signal
        if self._client_drops(sig):
            return
        ranks = list(sig.faultRanks)
        if ranks:
            self._fault_ranks = ranks
        if self._rejected(sig):
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
        self._answered_since = True
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
                self._answered_since = True
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
                self._answered_since = True
                r = await self.stub.ReplyStressTestResult(
                    recover_pb2.StressTestResult(jobId=self.job_id, stressResult=res), metadata=self.metadata
                )
                self._record("reply", rpc="ReplyStressTestResult", code=r.code)
