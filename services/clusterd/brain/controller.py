"""The per-job recovery controller: the Recover state machine of clusterd.md §7 and §4.

One :class:`Controller` per registered job (Recover Register creates it). It owns:

- the signal stream (``SubscribeProcessManageSignal``): a 1-slot queue of ProcessManageSignal,
  ``keep-alive`` every ``keepalive_s``; a new subscription resets the controller and ends the older
  stream; when the stream ends the controller resets again;
- report slots (ReportStopComplete / ReportRecoverStrategy / ReportRecoverStatus, ReplySwitchNicResult,
  ReplyStressTestResult): a report is consumed only while the flow waits for that kind, otherwise it
  is dropped as "order mix" (§7.2) and the call still answers 0 as the reference does;
- at most one *flow* task: fault recovery, NIC switch, stress test, sub-health hot switch or grace
  exit. Every wait ends (``report_s`` default 900 s, configurable so tests use ms).

States use the reference's names (INIT, NotifyStopTrain, WaitReportStopComplete, ...). Every
decision is recorded through ``brain.decide(job_id, ...)`` (logged and queryable over HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from clusterd.brain import strategy as strat
from clusterd.brain.faultview import RankFault
from faultmesh._pb import recover_pb2
from faultmesh.log import event

log = logging.getLogger("clusterd.brain")

INIT = "INIT"
KEEP_ALIVE = "keep-alive"


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
    hot_switch_wait_s: float = 60.0  # backup pod running
    scale_wait_s: float = 270.0  # elastic training: resources back
    kill_s: float = 60.0  # killMaster enqueue
    poll_s: float = 1.0
    subscriber_wait_s: float = 10.0  # an O&M notify stream (SubscribeNotifySwitch / ExecStressTest)


class FlowEnd(Exception):
    """Raised inside a flow to end it (the controller returns to INIT)."""


class Controller:
    """The state machine of one job (module docstring). ``brain`` gives job data and decisions."""

    def __init__(self, brain, job_id: str, timeouts: Timeouts) -> None:
        self.brain = brain
        self.job_id = job_id
        self.t = timeouts
        self.state = INIT
        self.flow_name = ""
        self._flow: asyncio.Task | None = None
        self._signals: asyncio.Queue | None = None
        self._stream_gen = 0
        self._reports: dict[str, asyncio.Queue] = {}
        self._expect: set[str] = set()
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
                    item = await asyncio.wait_for(q.get(), self.t.keepalive_s)
                except TimeoutError:
                    yield recover_pb2.ProcessManageSignal(jobId=job_id, signalType=KEEP_ALIVE)
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
    ) -> bool:
        """Send one ProcessManageSignal on the stream; True once it was written (False: no stream,
        queue busy for ``send_s``). ``new_id`` makes a new uuid (stopTrain, pause)."""
        if new_id or not self.uuid:
            self.uuid = new_uuid()
        sig = recover_pb2.ProcessManageSignal(
            uuid=self.uuid,
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
            await asyncio.wait_for(q.put((sig, fut)), self.t.send_s)
            ok = await asyncio.wait_for(fut, self.t.send_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            fut.cancel()
            if isinstance(e, asyncio.CancelledError):
                raise
            event(log, logging.WARNING, "signal not sent: stream busy", job=self.job_id, signal=signal_type)
            return False
        self.brain.m_signals.labels(signal_type).inc()
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
            uuid=self.uuid,
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
        """Hand a client report to the flow. Returns 0, or 504 when the slot stays busy for 1 s.

        A report the flow does not wait for is dropped ("order mix", clusterd.md §7.2)."""
        if kind not in self._expect:
            self.brain.count_rejected("order_mix")
            event(
                log, logging.INFO, "report dropped: order mix", job=self.job_id, report=kind, state=self.state
            )
            return 0
        try:
            await asyncio.wait_for(self._slot(kind).put(msg), 1.0)
        except TimeoutError:
            return 504
        return 0

    async def wait(self, *kinds: str, timeout_s: float | None = None) -> tuple[str, Any] | None:
        """Wait for the first report of ``kinds`` (already expected). None on timeout."""
        timeout_s = self.t.report_s if timeout_s is None else timeout_s
        getters = {asyncio.ensure_future(self._slot(k).get()): k for k in kinds}
        try:
            done, _ = await asyncio.wait(getters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for g in getters:
                if not g.done():
                    g.cancel()
        for k in kinds:
            self._expect.discard(k)
        if not done:
            return None
        g = next(iter(done))
        return getters[g], g.result()

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
        self._flow = self.brain.spawn(self._run_flow(name, coro_fn), f"flow-{name}-{self.job_id}")
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
            self.brain.decide(self.job_id, name, "reset", f"handler error: {e!r}")
        finally:
            self._expect.clear()
            self.hidden_nodes.clear()
            self.om_kind = ""
            self.set_state(INIT)
            self.flow_name = ""

    async def reset(self, reason: str) -> None:
        """Cancel the flow, drop pending reports, back to INIT (a new or ended subscription)."""
        flow = self._flow
        if flow is not None and not flow.done() and flow is not asyncio.current_task():
            flow.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(flow), 2.0)
            self.brain.decide(self.job_id, self.flow_name or "controller", "reset", reason)
        self._flow = None
        self._expect.clear()
        self.hidden_nodes.clear()
        self.cached_faults.clear()
        self._finish_om(f"om failed, {reason}")
        self.om_kind = ""
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
            await asyncio.wait_for(q.put((msg, fut)), self.t.subscriber_wait_s)
            return bool(await asyncio.wait_for(fut, self.t.subscriber_wait_s))
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
        self.brain.decide(self.job_id, flow, "kill-job", reason)
        ok = await self.signal("killMaster", [])
        if not ok:
            event(log, logging.WARNING, "killMaster not delivered", job=self.job_id)
        raise FlowEnd

    def _pod_ranks(self, faults) -> list[str]:
        return sorted({str(f.pod_rank) for f in faults if f.pod_rank >= 0}, key=int)

    # -- fault recovery (§7.3) ---------------------------------------------------------------------
    def add_faults(self, faults: list[RankFault]) -> None:
        """Merge rank faults into the cached faults (the reset CM's fault list)."""
        for f in faults:
            self.cached_faults[(f.rank, f.code)] = f

    async def recovery(self, trigger: str) -> None:
        """The main path of §7.3 for the cached faults (run inside a flow)."""
        job = self.brain.jobs.get(self.job_id)
        if job is None:
            raise FlowEnd
        flow = "recovery"
        configured = job.strategies()
        faults = list(self.cached_faults.values())
        self.set_state("NotifyWaitFaultFlushing")
        if [s for s in configured if s != "exit"] == ["dump"]:
            self.brain.decide(self.job_id, flow, "dump", "dump is the only strategy", faults=faults)
            await self.dump_and_exit(flow, "saveAndExit")
            return
        self.set_state("NotifyStopTrain")
        self.expect("stop")
        if not await self.signal("stopTrain", ["stop_train"], faults, new_id=True):
            self.brain.decide(self.job_id, flow, "fault-clear", "stopTrain not delivered (no stream)")
            raise FlowEnd
        self.set_state("WaitReportStopComplete")
        r = await self.wait("stop")
        if r is None:
            self.brain.decide(
                self.job_id, flow, "fault-clear", f"stop complete not reported in {self.t.report_s}s"
            )
            raise FlowEnd
        rep = r[1]
        if rep.status.code == 404:
            await self.kill_job(flow, "processes not ready (ReportStopComplete 404)")
        self._merge_reported(rep.faultRanks)
        faults = list(self.cached_faults.values())
        self.set_state("WaitFaultFlushFinished")
        pure_uce = faults and all(f.fault_type == "0" for f in faults) and "retry" in configured
        if not pure_uce:
            await asyncio.sleep(self.t.flush_s)
        faults = list(self.cached_faults.values())
        self.set_state("NotifyGlobalFault")
        retry_only = faults and all(f.fault_type in ("0", "2") for f in faults) and "retry" in configured
        self.expect("strategy")
        if retry_only:
            timeout = 33 if any(f.fault_type == "2" for f in faults) else 0
            ok = await self.signal("globalFault", ["on_global_rank"], faults, sig_timeout=timeout)
        else:
            levels = {f.level for f in faults}
            in_place = "recover-in-place" in configured and levels <= set(strat.IN_PLACE_LEVELS)
            action = "fault_nodes_restart" if in_place else "fault_nodes_exit"
            ok = await self.signal(
                "globalFault", ["on_global_rank", action], faults, node_rank_ids=self._pod_ranks(faults)
            )
        if not ok:
            self.brain.decide(self.job_id, flow, "fault-clear", "globalFault not delivered")
            raise FlowEnd
        self.set_state("WaitReportRecoverStrategy")
        r = await self.wait("strategy")
        if r is None:
            await self.kill_job(flow, f"recover strategy not reported in {self.t.report_s}s")
        self.agent_strategies = list(r[1].strategies)
        self._merge_reported(r[1].faultRanks)
        await self.decide_and_run(flow, trigger)

    async def pre_exit(self, faults: list[RankFault]) -> None:
        """``preExitProcess`` ["pre exit process"] for faults that joined a running recovery:
        all ranks as type "1", nodeRankIds = their pod ranks (clusterd.md §7.2)."""
        normal = [_normal(f) for f in faults]
        ok = await self.signal(
            "preExitProcess", ["pre exit process"], normal, node_rank_ids=self._pod_ranks(normal)
        )
        self.brain.decide(
            self.job_id, "recovery", "pre-exit", "new fault while recovering" if ok else "preExitProcess not delivered",
            faults=normal,
        )  # fmt: skip

    def _merge_reported(self, ranks) -> None:
        job = self.brain.jobs.get(self.job_id)
        for fr in ranks:
            try:
                rank = int(fr.rankId)
            except ValueError:
                continue
            if any(k[0] == rank for k in self.cached_faults):
                continue
            r = next((x for x in job.ranks if x.rank == rank), None) if job else None
            if r is None:
                continue
            self.cached_faults[(rank, "")] = RankFault(
                rank, r.node, r.device_id, job.pod_rank(r.node), "", "RestartBusiness",
                fr.faultType or "1", int(time.time() * 1000),
            )  # fmt: skip

    async def decide_and_run(self, flow: str, trigger: str) -> None:
        """Choose strategies with fallback until one succeeds or exit ran (§7.3 steps 5-6)."""
        job = self.brain.jobs.get(self.job_id)
        if job is None:
            raise FlowEnd
        allowed: tuple[str, ...] = strat.ORDER
        reported = set(self.agent_strategies)
        while True:
            faults = list(self.cached_faults.values())
            pod0 = any(f.pod_rank == 0 for f in faults)
            choice = strat.choose(
                job.strategies(),
                reported,
                [f.fault_type for f in faults],
                [f.level for f in faults],
                pod0,
                allowed,
            )
            self.brain.decide(
                self.job_id, flow, choice.strategy, choice.reason, faults=faults, trigger=trigger,
                reported=sorted(reported),
            )  # fmt: skip
            if choice.strategy != "retry":  # retry not chosen: retry faults become normal faults
                for k, f in list(self.cached_faults.items()):
                    self.cached_faults[k] = _normal(f)
            ok, code = await self.run_strategy(flow, choice)
            if ok:
                return
            self.brain.decide(
                self.job_id,
                flow,
                f"{choice.strategy}-failed",
                f"status code {code}" if code is not None else f"no status reported in {self.t.report_s}s",
            )
            if choice.strategy == "retry" and code != 405:
                reported.discard("recover")  # §7.3 step 6: recover is removed ("dump" too on 499)
                if code == 499:
                    reported.discard("dump")
            allowed = strat.AFTER_FAILURE[choice.strategy]
            if choice.strategy == "exit":
                return

    async def run_strategy(self, flow: str, choice: strat.Choice) -> tuple[bool, int | None]:
        """Send ``changeStrategy`` and wait for its status. Returns (success, status code or None)."""
        s = choice.strategy
        if s == "exit":
            self.set_state("NotifyDecidedStrategy")
            await self.signal("changeStrategy", ["change_strategy"], change_strategy="exit")
            self.set_state("CheckRecoverResult")
            self.brain.decide(self.job_id, flow, "exit-completed", self._after_exit())
            return True, 0
        if s == "dump":  # dump_and_exit ends with exit either way: nothing left to fall back to
            await self.dump_and_exit(flow, "changeStrategy")
            return True, 0
        state = {
            "retry": "WaitReportStepRetryStatus",
            "recover": "WaitReportProcessRecoverStatus",
            "recover-in-place": "WaitReportProcessRecoverStatus",
            "elastic-training": "WaitReportScaleInIsolateRanks",
        }[s]
        self.set_state("NotifyDecidedStrategy")
        self.expect("status")
        actions = ["change_strategy"] + (["fault_nodes_restart"] if s == "recover-in-place" else [])
        if not await self.signal(
            "changeStrategy", actions, change_strategy=choice.signal, extra=choice.extra
        ):
            return False, None
        self.set_state(state)
        r = await self.wait("status")
        if r is None:
            return False, None
        code = r[1].status.code
        if s == "elastic-training":
            return await self._elastic(flow, r[1])
        if code == 0:
            self.brain.decide(self.job_id, flow, f"{s}-success", "training side reported status 0")
            self.cached_faults.clear()
            return True, 0
        return False, code

    async def _elastic(self, flow: str, rep) -> tuple[bool, int | None]:
        """Elastic training (DP scale-in, then scale-out when the fault ranks are healthy again)."""
        if rep.status.code == 201:
            isolate = []
            job = self.brain.jobs.get(self.job_id)
            for rid in rep.isolateRankIds:
                node = job.node_of_rank(int(rid)) if job and rid.isdigit() else None
                if node is not None:
                    isolate.append(str(job.pod_rank(node)))
            self.expect("status")
            await self.signal(
                "faultNodesExit", ["fault_nodes_exit"], node_rank_ids=sorted(set(isolate), key=int)
            )
            r = await self.wait("status")
            if r is None:
                return False, None
            rep = r[1]
        if rep.status.code != 0:
            return False, rep.status.code
        self.set_state("ScaleInRunning")
        self.brain.decide(self.job_id, flow, "scale-in-success", "training continues on fewer DP groups")
        deadline = time.monotonic() + self.t.scale_wait_s
        while time.monotonic() < deadline:
            if not self.brain.current_faults(self.job_id, self.cached_faults):
                break
            await asyncio.sleep(self.t.poll_s)
        else:
            self.brain.decide(
                self.job_id, flow, "scale-in-kept", f"fault ranks not healthy within {self.t.scale_wait_s}s"
            )
            return True, 0
        self.expect("status")
        await self.signal(
            "changeStrategy",
            ["change_strategy"],
            change_strategy="upgrade",
            extra='{"scale-out-strategy": "DP"}',
        )
        r = await self.wait("status")
        if r is None or r[1].status.code != 0:
            return False, None if r is None else r[1].status.code
        self.brain.decide(self.job_id, flow, "scale-out-success", "fault ranks healthy again")
        self.cached_faults.clear()
        return True, 0

    async def dump_and_exit(self, flow: str, how: str) -> bool:
        """Dump (``saveAndExit`` or ``changeStrategy dump``), then ``changeStrategy exit`` dump_exit."""
        self.set_state("NotifyDump")
        self.expect("status")
        if how == "saveAndExit":
            faults = list(self.cached_faults.values())
            ok = await self.signal("saveAndExit", ["save_and_exit"], faults)
        else:
            ok = await self.signal("changeStrategy", ["change_strategy"], change_strategy="dump")
        if not ok:
            await self.kill_job(flow, "dump signal not delivered")
        self.set_state("WaitReportDumpStatus")
        r = await self.wait("status")
        if r is None:
            self.brain.decide(
                self.job_id, flow, "dump-failed", f"dump status not reported in {self.t.report_s}s"
            )
            await self.kill_job(flow, "dump timed out")
        success = r[1].status.code == 0
        self.brain.decide(
            self.job_id, flow, "dump-success" if success else "dump-failed", f"status {r[1].status.code}"
        )
        await self.signal("changeStrategy", ["change_strategy"], change_strategy="exit", extra="dump_exit")
        self.set_state("CheckRecoverResult")
        self.brain.decide(self.job_id, flow, "exit-completed", self._after_exit())
        self.cached_faults.clear()
        return success

    def _after_exit(self) -> str:
        job = self.brain.jobs.get(self.job_id)
        if job and job.rescheduling():
            return (
                f"processes exited; {'/'.join(job.rescheduling())} restarts the job away from the fault nodes"
            )
        return "processes exited; no rescheduling configured, the job stops"

    # -- NIC switch (§4.1) -------------------------------------------------------------------------
    async def nic_switch(self, ranks: list[str], ops: list[bool]) -> None:
        """Pause → SwitchRankList → result → continue (or normal recovery / kill job)."""
        flow = "switch-nic"
        try:
            await self._pause(flow)
            self.set_state("NotifySwitchNic")
            self.expect("switch", "status")
            msg = recover_pb2.SwitchRankList(rankID=ranks, op=ops, jobId=self.job_id)
            if not await self.push_notify("nic", msg):
                self._finish_om("om failed, send signal failed")
                await self.kill_job(flow, "SwitchRankList not delivered (no SubscribeNotifySwitch stream)")
            self.set_state("WaitSwitchNicFinished")
            r = await self.wait("switch", "status")
            failed = None
            if r is None:
                failed = "switch nic timeout"
            elif r[0] == "status" and r[1].status.code == 406:
                failed = "recv fault, when switching nic"
            elif r[0] == "switch" and not r[1].result:
                failed = "switch nic failed"
            elif r[0] == "status":
                failed = f"unexpected recover status {r[1].status.code}"
            if failed:
                self._finish_om(f"switch nic failed, {failed}")
                self.brain.decide(self.job_id, flow, "stop-train", failed)
                job = self.brain.jobs.get(self.job_id)
                self.add_faults(self.brain.rank_faults_for(job, [int(x) for x in ranks]))
                await self.recovery(flow)
                return
            await self._continue(flow)
            self._finish_om("switch nic finish")
            self.brain.decide(self.job_id, flow, "switch-nic-success", f"ranks {','.join(ranks)} switched")
        finally:
            self._finish_om("om failed, switch nic interrupted")

    async def _pause(self, flow: str) -> None:
        self.set_state("NotifyPauseTrain")
        self.expect("stop")
        timeout = 900 if self.om_kind == "stress" else 0
        if not await self.signal("stopTrain", ["pause_train"], sig_timeout=timeout, new_id=True):
            self._finish_om("om failed, send signal failed")
            await self.kill_job(flow, "pause_train not delivered")
        self.set_state("WaitReportPauseComplete")
        r = await self.wait("stop")
        if r is None:
            self._finish_om("pause train timeout")
            await self.kill_job(flow, f"pause not reported in {self.t.report_s}s")
        if r[1].status.code == 499:
            self._finish_om("pause train failed")
            await self.kill_job(flow, "pause failed (499)")

    async def _continue(self, flow: str) -> None:
        self.set_state("NotifyContinueTrain")
        self.expect("status")
        if not await self.signal("changeStrategy", ["change_strategy"], change_strategy="continue"):
            self._finish_om("om failed, send signal failed")
            await self.kill_job(flow, "continue not delivered")
        self.set_state("WaitContinueTrain")
        r = await self.wait("status")
        if r is None or r[1].status.code == 499:
            self._finish_om("continue train failed" if r else "continue train timeout")
            await self.kill_job(flow, "continue not confirmed" if r is None else "continue failed (499)")

    # -- stress test (§4.2) ------------------------------------------------------------------------
    async def stress_test(self, params: dict[str, dict[str, list[int]]]) -> None:
        """``params``: node -> rank -> ops. Pause → test → continue, isolate (code 2) or recover (3/4)."""
        flow = "stress-test"
        try:
            await self._pause(flow)
            self.set_state("NotifyStressTest")
            self.expect("stress", "status")
            flat = {
                rank: recover_pb2.StressOpList(ops=ops) for n in params.values() for rank, ops in n.items()
            }
            msg = recover_pb2.StressTestRankParams(stressParam=flat, jobId=self.job_id)
            if not await self.push_notify("stress", msg):
                self._finish_om("om failed, send signal failed")
                await self.kill_job(flow, "StressTestRankParams not delivered")
            self.set_state("WaitStressTestFinished")
            self.hidden_nodes = set(params)
            await self.signal("pauseStartAgent", ["pause_start_agent"])
            fault_during = False
            deadline = time.monotonic() + self.t.report_s
            result = None
            while True:
                r = await self.wait("stress", "status", timeout_s=max(0.0, deadline - time.monotonic()))
                if r is None:
                    break
                if r[0] == "status":
                    if r[1].status.code == 406:
                        fault_during = True
                        self._finish_om("recv fault, when stressing test")
                    self.expect("stress", "status")
                    continue
                result = r[1]
                break
            self.hidden_nodes = set()
            await self.signal("continueStartAgent", ["continue_start_agent"])
            if result is None:
                self._finish_om("stress test timeout")
                self.brain.decide(self.job_id, flow, "stop-train", "stress test result not reported")
                job = self.brain.jobs.get(self.job_id)
                ranks = [int(r) for n in params.values() for r in n]
                self.add_faults(self.brain.rank_faults_for(job, ranks))
                await self.recovery(flow)
                return
            await self._stress_result(flow, params, result, fault_during)
        finally:
            self.hidden_nodes = set()
            self._finish_om("om failed, stress test interrupted")

    async def _stress_result(self, flow, params, result, fault_during: bool) -> None:
        job = self.brain.jobs.get(self.job_id)
        isolate: set[str] = set()
        fault_ranks: list[int] = []
        table: dict[str, dict[str, dict[str, dict[str, str]]]] = {}
        for rank, rr in result.stressResult.items():
            node = job.node_of_rank(int(rank)) if job and rank.isdigit() else None
            if node is None:
                continue
            dev = next((str(r.device_id) for r in job.ranks if str(r.rank) == rank), rank)
            for op, res in rr.rankResult.items():
                table.setdefault(node, {}).setdefault(dev, {})[op] = {"code": res.code, "result": res.result}
                if res.code == "2":
                    isolate.add(node)
                elif res.code in ("3", "4"):
                    fault_ranks.append(int(rank))
        if isolate:
            self._finish_om(f"stress test find fault, isolate node:{sorted(isolate)}")
            self.brain.decide(self.job_id, flow, "isolate-node", f"stress test code 2 on {sorted(isolate)}")
            await self.brain.isolate_nodes(self.job_id, sorted(isolate))
            fault_ranks += [r.rank for n in isolate for r in job.ranks_on(n)]
        elif fault_ranks:
            self._finish_om(f"stress test timeout fault, faultRank:{sorted(set(fault_ranks))}")
        if fault_ranks or isolate:
            self.brain.decide(
                self.job_id, flow, "stop-train", f"stress test faults on ranks {sorted(set(fault_ranks))}"
            )
            self.add_faults(self.brain.rank_faults_for(job, sorted(set(fault_ranks))))
            await self.recovery(flow)
            return
        self._finish_om(
            ("stress test failed, " if fault_during else "")
            + "stress test finish, result:"
            + json.dumps(table, sort_keys=True, separators=(",", ":"))
        )
        await self._continue(flow)
        self.brain.decide(self.job_id, flow, "stress-test-success", "all ops returned code 0/1")

    # -- sub-health (§7.3 "Hot switch", principles doc 亚健康热切) ------------------------------------
    async def hot_switch(self, faults: list[RankFault]) -> None:
        """Switch the sub-healthy pod to a backup node; any failure falls back to job-level
        rescheduling and degrades the job's subHealthyStrategy to ignore."""
        flow = "hot-switch"
        job = self.brain.jobs.get(self.job_id)
        fault_nodes = sorted({f.node for f in faults})
        self.set_state("NotifyHotSwitch")
        if not await self.signal("hot-switch", ["hot switch"], faults, new_id=True):
            await self.brain.degrade(self.job_id, flow, "hot-switch signal not delivered")
            raise FlowEnd
        self.set_state("WaitNewPodRunning")
        backup = None
        deadline = time.monotonic() + self.t.hot_switch_wait_s
        while True:
            backup = self.brain.pick_backup(job, len(fault_nodes))
            if backup or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(self.t.poll_s, max(0.0, deadline - time.monotonic())))
        if not backup:
            await self.signal("hot-switch", ["stop switch"], faults)
            await self.brain.degrade(
                self.job_id, flow, "no backup node became ready (no healthy backupNodes)"
            )
            raise FlowEnd
        self.expect("strategy")
        await self.signal("hot-switch", ["new pod running"], faults)
        self.set_state("WaitReportRecoverStrategy")
        r = await self.wait("strategy")
        if r is None or not [s for s in r[1].strategies if s != "exit"]:
            why = "pause not reported in time" if r is None else "training side can only exit"
            await self.brain.degrade(self.job_id, flow, why)
            await self.kill_job(flow, f"hot switch stopped: {why}; job-level rescheduling")
        self.set_state("NotifyMigration")
        mapping = dict(zip(fault_nodes, backup, strict=False))
        self.expect("status")
        await self.signal("changeStrategy", ["change_strategy"], faults, change_strategy="migration")
        self.set_state("WaitReportMigrationStatus")
        r = await self.wait("status")
        if r is None or r[1].status.code != 0:
            why = "resume not reported in time" if r is None else f"resume failed ({r[1].status.code})"
            await self.brain.degrade(self.job_id, flow, why)
            await self.kill_job(flow, f"hot switch failed: {why}; job-level rescheduling")
        await self.brain.move_ranks(self.job_id, mapping)
        self.brain.decide(self.job_id, flow, "hot-switch-success", f"pods moved {mapping}")

    async def grace_exit(self, faults: list[RankFault]) -> None:
        """graceExit: a dying-gasp save (``saveAndExit``), then exit."""
        self.add_faults(faults)
        await self.dump_and_exit("grace-exit", "saveAndExit")


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
