"""The per-job recovery controller's channel to the training side (clusterd.md §7.2, §4).

:class:`SignalChannel` owns everything between the controller and the Recover servicer:

- the signal stream (``SubscribeProcessManageSignal``): a 1-slot queue of ProcessManageSignal,
  ``keep-alive`` every ``keepalive_s``; signals go out one at a time and paced (:meth:`signal`);
- report slots (ReportStopComplete / ReportRecoverStrategy / ReportRecoverStatus, ReplySwitchNicResult,
  ReplyStressTestResult): a report is consumed only while the flow waits for that kind, otherwise it
  is dropped as "order mix" (§7.2) and the call still answers 0 as the reference does;
- the O&M notify streams (SubscribeNotifySwitch / SubscribeNotifyExecStressTest) and the O&M reply.

It reads the flow's uuid and writes the signals sent into the controller's
:class:`~clusterd.brain.ctlstate.ControllerState`; it never changes the state name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from clusterd.brain.ctlstate import KEEP_ALIVE, ControllerState, Timeouts, new_uuid
from clusterd.brain.faultview import RankFault
from clusterd.brain.ports import ControllerPorts
from faultmesh._pb import recover_pb2
from faultmesh.log import event
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.brain")

# signals TaskD's manager handles at once (manager.go: role MgrRole), not as its latest ClusterD command
MGR_SIGNALS = ("pauseStartAgent", "continueStartAgent")


class SignalChannel:
    """Signal stream, report slots and O&M streams of one job's controller (module docstring)."""

    def __init__(self, st: ControllerState, t: Timeouts, ports: ControllerPorts) -> None:
        self.st = st
        self.t = t
        self.ports = ports
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
        self.om_reply: asyncio.Future | None = None  # final O&M message (one per operation)

    # -- the signal stream -------------------------------------------------------------------------
    @property
    def subscribed(self) -> bool:
        """True while a SubscribeProcessManageSignal stream is open."""
        return self._signals is not None

    def open_stream(self) -> tuple[asyncio.Queue, int]:
        """A new signal stream replaces the older one (which ends). Returns (its queue, its number)."""
        if self._signals is not None:
            close_queue(self._signals)
        q: asyncio.Queue = asyncio.Queue(maxsize=1)
        self._signals = q
        self._stream_gen += 1
        return q, self._stream_gen

    async def next_signal(self, q: asyncio.Queue, job_id: str):
        """The stream's next (signal, written future or None); a keep-alive with the flow's uuid
        ("" between flows) after ``keepalive_s`` without one; None when the stream ends."""
        try:
            return await wait_for(q.get(), self.t.keepalive_s)
        except TimeoutError:
            sig = recover_pb2.ProcessManageSignal(uuid=self.st.uuid, jobId=job_id, signalType=KEEP_ALIVE)
            return sig, None

    def end_stream(self, q: asyncio.Queue, gen: int) -> bool:
        """The stream ``gen`` ended: True when it was the current one (then the controller resets)."""
        if self._stream_gen != gen:
            return False
        self._signals = None
        close_queue(q)
        return True

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
            if new_id or not self.st.uuid:
                self.st.uuid = new_uuid()
            sig = recover_pb2.ProcessManageSignal(
                uuid=new_uuid() if own_id else self.st.uuid,
                jobId=self.st.job_id,
                signalType=signal_type,
                actions=actions or [],
                faultRanks=[
                    recover_pb2.FaultRank(rankId=str(rank), faultType=t)
                    for rank, t in per_rank(fault_ranks or [])
                ],
                changeStrategy=change_strategy,
                timeout=sig_timeout,
                nodeRankIds=node_rank_ids or [],
                extraParams=extra,
            )
            ok = await self._send(sig, list(actions or []) + ([change_strategy] if change_strategy else []))
            if ok and signal_type not in MGR_SIGNALS:
                self._last_cmd_t = time.monotonic()
                self._answered.clear()
            if ok and signal_type in ("globalFault", "changeStrategy", "killMaster"):
                self._stop_released.set()
            return ok

    async def _send(self, sig, shown: list[str]) -> bool:
        q = self._signals
        if q is None:
            return self._not_sent("no subscriber", sig)
        fut = asyncio.get_running_loop().create_future()
        try:
            await wait_for(q.put((sig, fut)), self.t.send_s)
            ok = await wait_for(fut, self.t.send_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            fut.cancel()
            if isinstance(e, asyncio.CancelledError):
                raise
            return self._not_sent("stream busy", sig)
        self.ports.count_signal(sig.signalType)
        self.st.sent.append((sig.signalType, shown))
        del self.st.sent[:-50]
        event(
            log, logging.INFO, "signal sent", job=self.st.job_id, signal=sig.signalType,
            actions=",".join(sig.actions), strategy=sig.changeStrategy, uuid=sig.uuid,
        )  # fmt: skip
        return bool(ok)

    def _not_sent(self, why: str, sig) -> bool:
        event(log, logging.WARNING, f"signal not sent: {why}", job=self.st.job_id, signal=sig.signalType)
        return False

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

    def unexpect(self, *kinds: str) -> None:
        """Stop accepting reports of ``kinds`` (a wait polled with ``keep`` is over)."""
        self._expect.difference_update(kinds)

    async def report(self, kind: str, msg: Any) -> int:
        """Hand a client report to the flow: put it in the kind's 1-slot channel. Returns 0 once it
        is in the slot; while the slot is full the call *waits* (the reference's Report RPCs block
        on the channel send, fault_recover_service.go) until the flow takes the report before it,
        599 when the controller resets or the flow ends meanwhile (the reference's closed channel:
        "chan closed"), 504 after ``report_s`` (faultmesh's bound; the reference waits for ever).

        A report the flow does not wait for is dropped ("order mix", clusterd.md §7.2)."""
        self.client_answered()
        job = self.st.job_id
        if kind not in self._expect:
            self.ports.count_rejected("order_mix")
            event(log, logging.INFO, "report dropped: order mix", job=job, report=kind, state=self.st.state)
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
            event(log, logging.INFO, "blocked report dropped: controller reset", job=job, report=kind)
            return 599
        event(log, logging.WARNING, "report dropped: slot busy", job=job, report=kind)
        return 504

    def clear(self) -> None:
        """A flow ended or the controller reset: expect nothing, answer every report blocked on a full
        slot with 599 (the reference closes the channels), and release a held stopTrain."""
        self._expect.clear()
        if self._slots_closed is not None and not self._slots_closed.done():
            self._slots_closed.set_result(None)
        self._slots_closed = None
        self._stop_released.set()

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
                self.unexpect(*kinds)

    # -- O&M streams and reply ---------------------------------------------------------------------
    def start_om(self) -> None:
        """Begin an O&M operation: its single reply future is visible to the O&M subscriber."""
        self.om_reply = asyncio.get_running_loop().create_future()

    def finish_om(self, msg: str) -> None:
        """Answer the O&M operation's reply (once; later answers are ignored)."""
        if self.om_reply is not None and not self.om_reply.done():
            self.om_reply.set_result(msg)
            event(log, logging.INFO, "o&m reply", job=self.st.job_id, kind=self.st.om_kind, reply=msg)

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
            close_queue(old)
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

    def close(self) -> None:
        """End every stream (job deleted or ClusterD stopping)."""
        if self._signals is not None:
            close_queue(self._signals)
            self._signals = None
        for q in (self.notify_switch, self.notify_stress):
            if q is not None:
                close_queue(q)


def per_rank(faults) -> list[tuple[int, str]]:
    """One (rank, faultType) per rank, by rank; a normal fault ("1") wins over retry types."""
    out: dict[int, str] = {}
    for f in faults:
        if out.get(f.rank) != "1":
            out[f.rank] = f.fault_type
    return sorted(out.items())


def close_queue(q: asyncio.Queue) -> None:
    """End a stream: drop what is queued (failing its futures) and put the None sentinel."""
    while not q.empty():
        item = q.get_nowait()
        if item is not None and item[1] is not None and not item[1].done():
            item[1].set_result(False)
    with contextlib.suppress(asyncio.QueueFull):
        q.put_nowait(None)
