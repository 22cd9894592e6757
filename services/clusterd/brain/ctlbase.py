"""The per-job recovery controller, its base: signal stream, report slots, state, flow task.

See :mod:`clusterd.brain.controller` for the whole picture; the flows live in
:mod:`clusterd.brain.flows` (fault recovery) and :mod:`clusterd.brain.omflows` (NIC switch, stress
test, hot switch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from clusterd.brain.faultview import RankFault
from clusterd.brain.ports import ControllerPorts
from faultmesh._pb import recover_pb2
from faultmesh.log import event
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.brain")

INIT = "INIT"
KEEP_ALIVE = "keep-alive"
# signals TaskD's manager handles at once (manager.go: role MgrRole), not as its latest ClusterD command
MGR_SIGNALS = ("pauseStartAgent", "continueStartAgent")


def new_uuid() -> str:
    """uuid = upper-case hex nanotime + "-" + 32 random hex chars (clusterd.md §7.3)."""
    return f"{time.time_ns():X}-{os.urandom(16).hex()}"


@dataclass
class Timeouts:
    """Every wait of the controller, in seconds (reference defaults; tests pass small values)."""

    report_s: float = 900.0  # each client report (15 min)
    keepalive_s: float = 5.0
    flush_s: float = 1.0  # WaitFaultFlushFinished
    send_s: float = 5.0  # a signal must reach the stream (enqueue 1 s + 3 tries)
    command_gap_s: float = 1.0  # TaskD's manager reads its latest ClusterD command once a second
    hot_switch_wait_s: float = 60.0  # backup pod running
    scale_wait_s: float = 270.0  # elastic training: resources back
    kill_s: float = 60.0  # killMaster enqueue
    fault_retry_s: float = 65.0  # FaultRetry: the job Running again after dump_exit (13 x 5 s)
    hccl_route_s: float = 3.0  # a retry with HCCL ranks waits for route convergence
    poll_s: float = 1.0
    subscriber_wait_s: float = 10.0  # an O&M notify stream (SubscribeNotifySwitch / ExecStressTest)
    in_place_wait_s: float = 15.0  # recover-in-place: the pods' faults must vanish (5 x 3 s)
    platform_s: float = 300.0  # platform mode: each wait for the AI platform (ProcessControlTimeout)
    pre_exit_wait_s: float = 10.0  # preExitProcess waits while INIT (sleepForStateChange, 10 x 1 s)
    job_wait_scale: float = 1.0  # x the job's own waits (wait-reschedule-timeout, MINDIO_WAIT_MINDX_TIME)


class FlowEnd(Exception):
    """Raised inside a flow to end it (the controller returns to INIT)."""


class ControllerBase:
    """The state machine of one job: its stream, report slots, state and flow task. ``ports`` gives
    job data and takes decisions. The flows are added by :class:`clusterd.brain.controller.Controller`."""

    def __init__(self, ports: ControllerPorts, job_id: str, timeouts: Timeouts) -> None:
        self.ports = ports
        self.job_id = job_id
        self.t = timeouts
        self.state = INIT
        self.flow_name = ""
        self._flow: asyncio.Task | None = None
        self._signals: asyncio.Queue | None = None
        self._stream_gen = 0
        self._reports: dict[str, asyncio.Queue] = {}
        self._expect: set[str] = set()
        self._slots_closed: asyncio.Future | None = None  # done when the slots close (reset, flow end)
        self._report_in = asyncio.Event()  # set whenever a report lands in a slot
        self._cmd_lock = asyncio.Lock()  # one signal at a time (the reference's 1-slot signal channel)
        self._last_cmd_t: float | None = None  # when the last command signal was written
        self._answered = asyncio.Event()  # the client reported since that signal
        # TaskD's stop-train plugin holds the last stopTrain until a globalFault / changeStrategy
        # (stop_train.go); a preExitProcess meanwhile would make it drop the next stopTrain
        self._stop_released = asyncio.Event()
        self._stop_released.set()
        self.notify_switch: asyncio.Queue | None = None  # SwitchRankList to the training side
        self.notify_stress: asyncio.Queue | None = None  # StressTestRankParams to the training side
        self.om_kind = ""  # "nic" | "stress" while an O&M flow runs
        self.om_reply: asyncio.Future | None = None  # final O&M message (one per operation)
        self.cached_faults: dict[tuple[int, str], RankFault] = {}
        self.seen_fault_keys: set[tuple[int, str]] = set()
        self.hidden_nodes: set[str] = set()  # nodes under stress test (80818C05/06 hidden)
        self.agent_strategies: list[str] = []
        self.uuid = ""
        self.sent: list[tuple[str, list[str]]] = []  # last signals (type, actions), for views/tests
        self._no_status = ""  # why the last strategy got no status (not sent / timed out)
        self.restart_proc_pods: set[int] = set()  # recover-in-place: pods that restart processes only
        self.in_place_dropped = False  # in-place was possible, another strategy restarts every pod
        self.plat_strategy = ""  # platform mode: the AI platform's ProcessRecoverStrategy
        self.flow_began = asyncio.Event()  # set (and replaced) when a flow starts: the state leaves INIT

    # -- subscription and signals ------------------------------------------------------------------
    @property
    def subscribed(self) -> bool:
        """True while a SubscribeProcessManageSignal stream is open."""
        return self._signals is not None

    async def stream(self, job_id: str):
        """Async generator serving SubscribeProcessManageSignal (resets the controller)."""
        await self.reset("new signal subscription")
        old = self._signals
        if old is not None:
            _close_queue(old)
        q: asyncio.Queue = asyncio.Queue(maxsize=1)
        self._signals = q
        self._stream_gen += 1
        gen = self._stream_gen
        try:
            while True:
                try:
                    item = await wait_for(q.get(), self.t.keepalive_s)
                except TimeoutError:
                    # the reference's keepAlive carries the controller's current uuid ("" between flows)
                    yield recover_pb2.ProcessManageSignal(uuid=self.uuid, jobId=job_id, signalType=KEEP_ALIVE)
                    continue
                if item is None:
                    return
                sig, fut = item
                yield sig
                if not fut.done():
                    fut.set_result(True)
        finally:
            if self._stream_gen == gen:
                self._signals = None
                _close_queue(q)
                await self.reset("signal stream ended")

    async def signal(
        self,
        signal_type: str,
        actions: list[str] | None = None,
        fault_ranks: list[RankFault] | None = None,
        change_strategy: str = "",
        sig_timeout: int = 0,
        node_rank_ids: list[str] | None = None,
        extra: str = "",
        new_id: bool = False,
        own_id: bool = False,
    ) -> bool:
        """Send one ProcessManageSignal on the stream; True once it was written (False: no stream,
        queue busy for ``send_s``). ``new_id`` makes a new flow uuid (stopTrain, pause); ``own_id``
        gives this signal alone a fresh uuid (preExitProcess), the flow's uuid stays.

        Signals go out one at a time, and a command (every type but pauseStartAgent /
        continueStartAgent) waits until ``command_gap_s`` after the previous one unless the client
        reported in between: TaskD's Go manager keeps only its latest ClusterD command and reads it
        once a second (manager.go Process, storage ClusterInfos.Command), so the earlier of two
        commands sent closer would never reach MindIO (faultmesh's own pacing, docs/compatibility.md)."""
        async with self._cmd_lock:
            if signal_type == "stopTrain":  # before any wait: a preExitProcess now waits for the release
                self._stop_released.clear()
            if signal_type not in MGR_SIGNALS:
                await self._pace()
            ok = await self._send_signal(
                signal_type, actions, fault_ranks, change_strategy, sig_timeout, node_rank_ids, extra,
                new_id, own_id,
            )  # fmt: skip
            if ok and signal_type not in MGR_SIGNALS:
                self._last_cmd_t = time.monotonic()
                self._answered.clear()
            if ok and signal_type in ("globalFault", "changeStrategy", "killMaster"):
                self._stop_released.set()
            return ok

    async def stop_train_released(self) -> None:
        """Wait (up to ``report_s``) until TaskD's stop-train plugin lets go of the flow's stopTrain:
        a globalFault / changeStrategy (or killMaster) sent since, or the flow's end."""
        with contextlib.suppress(TimeoutError):
            await wait_for(self._stop_released.wait(), self.t.report_s)

    async def _pace(self) -> None:
        if self._last_cmd_t is None or self._answered.is_set():
            return
        left = self._last_cmd_t + self.t.command_gap_s - time.monotonic()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await wait_for(self._answered.wait(), left)

    def client_answered(self) -> None:
        """The training side reported something (a Report*, Reply*, ReportProcessFault): its
        manager has read the last command, the next one need not wait (:meth:`signal`)."""
        self._answered.set()

    async def _send_signal(
        self, signal_type, actions, fault_ranks, change_strategy, sig_timeout, node_rank_ids, extra,
        new_id, own_id,
    ) -> bool:  # fmt: skip
        if new_id or not self.uuid:
            self.uuid = new_uuid()
        uuid = new_uuid() if own_id else self.uuid
        sig = recover_pb2.ProcessManageSignal(
            uuid=uuid,
            jobId=self.job_id,
            signalType=signal_type,
            actions=actions or [],
            faultRanks=[
                recover_pb2.FaultRank(rankId=str(rank), faultType=t)
                for rank, t in _per_rank(fault_ranks or [])
            ],
            changeStrategy=change_strategy,
            timeout=sig_timeout,
            nodeRankIds=node_rank_ids or [],
            extraParams=extra,
        )
        q = self._signals
        if q is None:
            event(log, logging.WARNING, "signal not sent: no subscriber", job=self.job_id, signal=signal_type)
            return False
        fut = asyncio.get_running_loop().create_future()
        try:
            await wait_for(q.put((sig, fut)), self.t.send_s)
            ok = await wait_for(fut, self.t.send_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            fut.cancel()
            if isinstance(e, asyncio.CancelledError):
                raise
            event(log, logging.WARNING, "signal not sent: stream busy", job=self.job_id, signal=signal_type)
            return False
        self.ports.count_signal(signal_type)
        self.sent.append((signal_type, list(actions or []) + ([change_strategy] if change_strategy else [])))
        del self.sent[:-50]
        event(
            log,
            logging.INFO,
            "signal sent",
            job=self.job_id,
            signal=signal_type,
            actions=",".join(actions or []),
            strategy=change_strategy,
            uuid=uuid,
        )
        return bool(ok)

    # -- reports -----------------------------------------------------------------------------------
    def _slot(self, kind: str) -> asyncio.Queue:
        q = self._reports.get(kind)
        if q is None:
            q = self._reports[kind] = asyncio.Queue(maxsize=1)
        return q

    def expect(self, *kinds: str) -> None:
        """Start accepting reports of ``kinds`` (call before sending the signal that asks for them)."""
        for k in kinds:
            q = self._slot(k)
            while not q.empty():
                q.get_nowait()
            self._expect.add(k)

    async def report(self, kind: str, msg: Any) -> int:
        """Hand a client report to the flow: put it in the kind's 1-slot channel. Returns 0 once it
        is in the slot; while the slot is full the call *waits* (the reference's Report RPCs block
        on the channel send, fault_recover_service.go) until the flow takes the report before it,
        599 when the controller resets or the flow ends meanwhile (the reference's closed channel:
        "chan closed"), 504 after ``report_s`` (faultmesh's bound; the reference waits for ever).

        A report the flow does not wait for is dropped ("order mix", clusterd.md §7.2)."""
        self.client_answered()
        if kind not in self._expect:
            self.ports.count_rejected("order_mix")
            event(
                log, logging.INFO, "report dropped: order mix", job=self.job_id, report=kind, state=self.state
            )
            return 0
        q = self._slot(kind)
        if not q.full():
            q.put_nowait(msg)
            self._report_in.set()
            return 0
        if self._slots_closed is None or self._slots_closed.done():
            self._slots_closed = asyncio.get_running_loop().create_future()
        closed = self._slots_closed
        put = asyncio.ensure_future(q.put(msg))
        try:
            await asyncio.wait({put, closed}, timeout=self.t.report_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not put.done():
                put.cancel()
        if put.done() and not put.cancelled():
            self._report_in.set()
            return 0
        if closed.done():
            event(log, logging.INFO, "blocked report dropped: controller reset", job=self.job_id, report=kind)
            return 599
        event(log, logging.WARNING, "report dropped: slot busy", job=self.job_id, report=kind)
        return 504

    def _close_slots(self) -> None:
        """Answer every report blocked on a full slot with 599 (the reference closes the channels)."""
        if self._slots_closed is not None and not self._slots_closed.done():
            self._slots_closed.set_result(None)
        self._slots_closed = None

    async def wait(
        self, *kinds: str, timeout_s: float | None = None, keep: bool = False
    ) -> tuple[str, Any] | None:
        """Wait for the first report of ``kinds`` (already expected): ``(kind, report)``, None on
        timeout (``timeout_s``, default ``report_s``). Takes one report only, the first kind listed
        when several are queued; the others stay in their slots (the reference's select on the
        channels). ``keep``: still expect ``kinds`` afterwards (a wait polled in steps)."""
        timeout_s = self.t.report_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                for k in kinds:
                    q = self._slot(k)
                    if not q.empty():
                        return k, q.get_nowait()
                left = deadline - loop.time()
                if left <= 0:
                    return None
                self._report_in.clear()
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._report_in.wait(), left)
        finally:
            if not keep:
                for k in kinds:
                    self._expect.discard(k)

    # -- flow management ---------------------------------------------------------------------------
    def busy(self) -> bool:
        """True while a flow runs (the state is not INIT)."""
        return self._flow is not None and not self._flow.done()

    def set_state(self, state: str) -> None:
        """Move to ``state`` (logged at debug)."""
        if state != self.state:
            log.debug("job=%s state %s -> %s", self.job_id, self.state, state)
        self.state = state

    def start_flow(self, name: str, coro_fn: Callable[[], Awaitable[None]]) -> bool:
        """Run ``coro_fn()`` as the job's flow if the state is INIT. Returns False when busy."""
        if self.busy() or self.state != INIT:
            return False
        self.flow_name = name
        began, self.flow_began = self.flow_began, asyncio.Event()
        self._flow = self.ports.spawn(self._run_flow(name, coro_fn), f"flow-{name}-{self.job_id}")
        began.set()
        return True

    async def _run_flow(self, name: str, coro_fn) -> None:
        try:
            await coro_fn()
        except FlowEnd:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a handler error resets the controller (§7.2)
            event(log, logging.ERROR, "recovery flow failed", job=self.job_id, flow=name, error=repr(e))
            self.ports.decide(self.job_id, name, "reset", f"handler error: {e!r}")
        finally:
            self._expect.clear()
            self._close_slots()  # the reference's handleFinish -> reset
            self._stop_released.set()
            self.hidden_nodes.clear()
            self.cached_faults.clear()  # the reference's reset after every flow
            self.restart_proc_pods, self.in_place_dropped = set(), False
            self.plat_strategy = ""
            self.uuid = ""
            self.om_kind = ""
            self.set_state(INIT)
            self.flow_name = ""

    async def reset(self, reason: str) -> None:
        """Cancel the flow, drop pending reports, back to INIT (a new or ended subscription)."""
        flow = self._flow
        if flow is not None and not flow.done() and flow is not asyncio.current_task():
            flow.cancel()
            with contextlib.suppress(BaseException):
                await wait_for(asyncio.shield(flow), 2.0)
            self.ports.decide(self.job_id, self.flow_name or "controller", "reset", reason)
        self._flow = None
        self._expect.clear()
        self._close_slots()
        self._stop_released.set()
        self.hidden_nodes.clear()
        self.cached_faults.clear()
        self.restart_proc_pods, self.in_place_dropped = set(), False
        self.plat_strategy = ""
        self._finish_om(f"om failed, {reason}")
        self.om_kind = ""
        self.uuid = ""
        self.set_state(INIT)

    async def close(self) -> None:
        """Stop everything (job deleted or ClusterD stopping): the stream ends."""
        await self.reset("controller closed")
        if self._signals is not None:
            _close_queue(self._signals)
            self._signals = None
        for q in (self.notify_switch, self.notify_stress):
            if q is not None:
                _close_queue(q)

    # -- O&M reply ---------------------------------------------------------------------------------
    def start_om(self, kind: str) -> None:
        """Begin an O&M operation: its single reply future is visible to the O&M subscriber."""
        self.om_kind = kind
        self.om_reply = asyncio.get_running_loop().create_future()

    def _finish_om(self, msg: str) -> None:
        if self.om_reply is not None and not self.om_reply.done():
            self.om_reply.set_result(msg)
            event(log, logging.INFO, "o&m reply", job=self.job_id, kind=self.om_kind, reply=msg)

    async def push_notify(self, kind: str, msg: Any) -> bool:
        """Put ``msg`` on the SubscribeNotifySwitch ("nic") or SubscribeNotifyExecStressTest ("stress")
        stream; False when no subscriber takes it within ``subscriber_wait_s``."""
        q = self.notify_switch if kind == "nic" else self.notify_stress
        if q is None:
            return False
        fut = asyncio.get_running_loop().create_future()
        try:
            await wait_for(q.put((msg, fut)), self.t.subscriber_wait_s)
            return bool(await wait_for(fut, self.t.subscriber_wait_s))
        except TimeoutError:
            fut.cancel()
            return False

    async def notify_stream(self, kind: str):
        """Async generator for SubscribeNotifySwitch / SubscribeNotifyExecStressTest (newest wins)."""
        q: asyncio.Queue = asyncio.Queue(maxsize=1)
        old = self.notify_switch if kind == "nic" else self.notify_stress
        if old is not None:
            _close_queue(old)
        if kind == "nic":
            self.notify_switch = q
        else:
            self.notify_stress = q
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                msg, fut = item
                yield msg
                if not fut.done():
                    fut.set_result(True)
        finally:
            if kind == "nic" and self.notify_switch is q:
                self.notify_switch = None
            if kind == "stress" and self.notify_stress is q:
                self.notify_stress = None

    # -- shared steps ------------------------------------------------------------------------------
    async def kill_job(self, flow: str, reason: str) -> None:
        """Signal ``killMaster`` (no actions), then end the flow (→ INIT). clusterd.md §7.3 step 8."""
        self.set_state("KillJob")
        self.ports.decide(self.job_id, flow, "kill-job", reason)
        ok = await self.signal("killMaster", [])
        if not ok:
            event(log, logging.WARNING, "killMaster not delivered", job=self.job_id)
        raise FlowEnd

    def _pod_ranks(self, faults) -> list[str]:
        """Sorted pod ranks (``nodeRankIds``) hosting ``faults`` (GetNodeRankIdsByFaultRanks)."""
        return sorted({str(f.pod_rank) for f in faults if f.pod_rank >= 0}, key=int)

    # -- fault recovery (§7.3) ---------------------------------------------------------------------
    def add_faults(self, faults: list[RankFault], new_ranks_only: bool = False) -> None:
        """Merge rank faults into the cached faults (the reset CM's fault list). ``new_ranks_only``:
        skip ranks already cached (a ReportProcessFault rank the hardware intake already holds)."""
        ranks = {k[0] for k in self.cached_faults} if new_ranks_only else set()
        for f in faults:
            if f.rank not in ranks:
                self.cached_faults[(f.rank, f.code)] = f

    def faults(self) -> list[RankFault]:
        """The cached faults, by rank then code."""
        return [self.cached_faults[k] for k in sorted(self.cached_faults)]

    def expand_to_pods(self, keep: set[int] | frozenset[int] = frozenset()) -> list[RankFault]:
        """Make every cached fault normal ("1") and add every other rank of each fault pod (the
        reference's GetFaultRankIdsInSameNode, §7.3 step 3): the pods told to exit lose all their
        ranks, so MindIO must hear of all of them. Pods in ``keep`` (pod ranks restarting their
        processes in place) keep only their own fault ranks. Returns the cached faults."""
        job = self.ports.jobs.get(self.job_id)
        for k, f in list(self.cached_faults.items()):
            self.cached_faults[k] = _normal(f)
        if job is not None:
            have = {k[0] for k in self.cached_faults}
            by_node = {f.node: f for f in self.cached_faults.values() if f.pod_rank not in keep}
            for node, f in by_node.items():
                for r in job.ranks_on(node):
                    if r.rank not in have:
                        self.cached_faults[(r.rank, "")] = replace(
                            f, rank=r.rank, device_id=r.device_id, code=""
                        )
        return self.faults()


def _per_rank(faults) -> list[tuple[int, str]]:
    """One (rank, faultType) per rank, by rank; a normal fault ("1") wins over retry types."""
    out: dict[int, str] = {}
    for f in faults:
        if out.get(f.rank) != "1":
            out[f.rank] = f.fault_type
    return sorted(out.items())


def _normal(f: RankFault) -> RankFault:
    return replace(f, fault_type="1")


def _close_queue(q: asyncio.Queue) -> None:
    """End a stream: drop what is queued (failing its futures) and put the None sentinel."""
    while not q.empty():
        item = q.get_nowait()
        if item is not None and not item[1].done():
            item[1].set_result(False)
    with contextlib.suppress(asyncio.QueueFull):
        q.put_nowait(None)
