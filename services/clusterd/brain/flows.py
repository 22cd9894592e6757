"""The fault recovery flow of the per-job controller (clusterd.md §7.2, §7.3): stop training, collect
the reports, choose a strategy (:mod:`.strategy`) and run it with fallback, dump-and-exit.

One object, :class:`RecoveryFlow`, over the controller core; the steps it composes live beside it:
recover-in-place (:mod:`.inplace`), the rescheduling waits (:mod:`.reschedule`), elastic training
(:mod:`.elastic`) and platform mode (:mod:`.platform`). FaultClear / FaultRetry and killMaster are the
core's (:mod:`.ctlcore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import SimpleNamespace

from clusterd.brain import states
from clusterd.brain import strategy as strat
from clusterd.brain.ctlcore import ControllerCore
from clusterd.brain.ctlstate import INIT, FlowEnd, normal, pod_ranks
from clusterd.brain.elastic import NEW_FAULT, ElasticSteps
from clusterd.brain.faultview import RankFault
from clusterd.brain.inplace import InPlaceSteps
from clusterd.brain.platform import PlatformSteps
from clusterd.brain.reschedule import RescheduleSteps
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.brain")


RESCHEDULE_TIMEOUT = -1  # run_strategy's code: the fault pods were not rescheduled in time


class RecoveryFlow:
    """The fault recovery flow (module docstring) over the controller core ``c``."""

    def __init__(self, c: ControllerCore) -> None:
        self.c = c
        self.st = c.st
        self.io = c.io
        self.in_place = InPlaceSteps(c)
        self.resched = RescheduleSteps(c)
        self.elastic = ElasticSteps(c, self.resched)
        self.platform = PlatformSteps(c)

    async def run(self, trigger: str) -> None:
        """The main path of §7.3 for the cached faults (run inside a flow)."""
        job = self.c.job()
        if job is None:
            raise FlowEnd
        flow = "recovery"
        configured = job.strategies()
        faults = self.st.faults()
        self.c.set_state(states.NOTIFY_WAIT_FAULT_FLUSHING)
        if self.platform.platform_mode():  # the AI platform decides (platform mode)
            await self.platform.wait_platform_strategy(flow)
            dump_only = self.st.plat_strategy == "dump" and "dump" in configured
        else:
            dump_only = [s for s in configured if s != "exit"] == ["dump"]
        if dump_only:
            self.c.decide(flow, "dump", "dump is the only strategy", faults=faults)
            await self.dump_and_exit(flow, "saveAndExit")
            return
        self.c.set_state(states.NOTIFY_STOP_TRAIN)
        self.io.expect("stop")
        if not await self.io.signal("stopTrain", ["stop_train"], faults, new_id=True):
            await self.c.fault_retry(flow, "stopTrain not delivered")
        self.c.set_state(states.WAIT_REPORT_STOP_COMPLETE)
        r = await self.io.wait("stop")
        if r is None:
            await self.c.fault_retry(flow, f"stop complete not reported in {self.c.t.report_s}s")
        rep = r[1]
        if rep.status.code == 404:
            await self.c.kill_job(flow, "processes not ready (ReportStopComplete 404)")
        self._merge_reported(rep.faultRanks)
        await self.global_fault_and_decide(flow, trigger)

    async def global_fault_and_decide(self, flow: str, trigger: str) -> None:
        """WaitFaultFlushFinished -> NotifyGlobalFault -> WaitReportRecoverStrategy -> the strategy
        (§7.3 steps 3-6). A retry answered 405 comes back here with its faults made normal."""
        retried = False
        while True:
            job = self.c.job()
            configured = self.platform.platform_configured(job.strategies() if job else [])
            faults = self.st.faults()
            self.c.set_state(states.WAIT_FAULT_FLUSH_FINISHED)
            retry_types = bool(faults) and all(f.fault_type in ("0", "2") for f in faults)
            retry_only = retry_types and "retry" in configured and not retried
            if not (retry_only and all(f.fault_type == "0" for f in faults)):
                await asyncio.sleep(self.c.t.flush_s)
            self.c.set_state(states.NOTIFY_GLOBAL_FAULT)
            if retry_only and self.platform.platform_mode():
                merged = await self.platform.confirm_faults(
                    flow, [(str(f.rank), f.fault_type) for f in faults]
                )
                self._merge_reported([SimpleNamespace(rankId=r, faultType=t) for r, t in merged])
                retry_only = all(t in ("0", "2") for _, t in merged)  # else the normal-fault case
            if retry_only:
                self.io.expect("strategy")
                faults = self.st.faults()
                timeout = 33 if any(f.fault_type == "2" for f in faults) else 0
                ok = await self.io.signal("globalFault", ["on_global_rank"], faults, sig_timeout=timeout)
            else:
                await self.in_place.split_in_place(flow, configured)
                if self.platform.platform_mode() and not retry_types:
                    pairs = [(str(f.rank), "1") for f in self.st.faults()]
                    merged = await self.platform.confirm_faults(flow, pairs)
                    self._merge_reported([SimpleNamespace(rankId=r, faultType="1") for r, _ in merged])
                self.c.set_state(states.NOTIFY_GLOBAL_FAULT)
                self.io.expect("strategy")
                faults = self.c.expand_to_pods(keep=self.st.restart_proc_pods)
                exit_pods = [p for p in pod_ranks(faults) if int(p) not in self.st.restart_proc_pods]
                # the reference: fault_nodes_exit, nodeRankIds = the pods that restart as pods (none
                # when every fault pod restarts its processes in place)
                ok = await self.io.signal(
                    "globalFault", ["on_global_rank", "fault_nodes_exit"], faults, node_rank_ids=exit_pods
                )
            if not ok:
                await self.c.kill_job(flow, "globalFault not delivered")
            self.c.set_state(states.WAIT_REPORT_RECOVER_STRATEGY)
            self.st.resched_started = time.monotonic()  # the reference starts listenScheduleResult here
            self.resched.note_fault_pods()
            r = await self.io.wait("strategy")
            if r is None:
                await self.c.fault_retry(flow, f"recover strategy not reported in {self.c.t.report_s}s")
            self.st.agent_strategies = list(r[1].strategies)
            self._merge_reported(r[1].faultRanks)
            if await self.decide_and_run(flow, trigger, after_retry=retried) != "again":
                return
            retried = True

    async def pre_exit(
        self, faults: list[RankFault], jobs, reason: str = "new fault while recovering"
    ) -> bool:
        """``preExitProcess`` ["pre exit process"]: all ranks as type "1", nodeRankIds = their pod
        ranks, a new uuid (clusterd.md §7.2). TaskD stops those workers and reports them with
        ReportProcessFault, which starts (or joins) the recovery.

        As the reference's sendPreExitSignal: while the controller is still INIT it first waits up
        to ``pre_exit_wait_s`` (10 s, sleepForStateChange) for a flow to start (TaskD's own
        ReportProcessFault when the workers died); then a fault pod replaced since the fault (its
        pod rank now on another node of ``jobs``' job: the reference's pod UID check) is left out;
        when none is left nothing is sent (decision ``pre-exit-skipped``; False).

        While the flow's stopTrain is held by TaskD's stop-train plugin (sent, no globalFault /
        changeStrategy yet) the signal waits for that: sent in between, it makes the plugin let go
        without forgetting the stopTrain, and TaskD drops the next flow's stopTrain (stop_train.go;
        faultmesh's own order, docs/compatibility.md). The fault has joined the flow's faults."""
        if self.st.state == INIT and not self.c.busy():
            with contextlib.suppress(TimeoutError):
                await wait_for(self.c.flow_began.wait(), self.c.t.pre_exit_wait_s)
        job = jobs.get(self.c.job_id)
        kept = [f for f in faults if job is not None and job.pod_rank(f.node) == f.pod_rank]
        decide = self.c.decide
        if not kept:
            decide("recovery", "pre-exit-skipped", "every fault pod was replaced", faults=faults)
            return False
        await self.io.stop_train_released()
        exits = [normal(f) for f in kept]
        ok = await self.io.signal(
            "preExitProcess", ["pre exit process"], exits, node_rank_ids=pod_ranks(exits), own_id=True
        )
        decide(
            "recovery", "pre-exit", reason if ok else "preExitProcess not delivered", faults=exits,
        )  # fmt: skip
        return ok

    def _merge_reported(self, ranks) -> None:
        job = self.c.job()
        for fr in ranks:
            try:
                rank = int(fr.rankId)
            except ValueError:
                continue
            if any(k[0] == rank for k in self.st.cached_faults):
                continue
            r = next((x for x in job.ranks if x.rank == rank), None) if job else None
            if r is None:
                continue
            self.st.cached_faults[(rank, "")] = RankFault(
                rank, r.node, r.device_id, job.pod_rank(r.node), "", "RestartBusiness",
                fr.faultType or "1", int(time.time() * 1000),
            )  # fmt: skip

    async def decide_and_run(self, flow: str, trigger: str, after_retry: bool = False) -> str:
        """Choose strategies with fallback until one succeeds or exit ran (§7.3 steps 5-6).

        Returns "done", or "again" when a retry was answered 405 (RecoverableRetryError: back to
        globalFault with ``fault_nodes_exit``). A status that never comes or a changeStrategy that
        cannot be sent ends in FaultClear / FaultRetry (:meth:`ControllerCore.fault_retry`)."""
        job = self.c.job()
        if job is None:
            raise FlowEnd
        allowed: tuple[str, ...] = strat.AFTER_FAILURE["retry"] if after_retry else strat.ORDER
        reported = set(self.st.agent_strategies)
        forced: strat.Choice | None = None
        while True:
            faults = self.st.faults()
            pod0 = any(f.pod_rank == 0 for f in faults)
            configured = self.platform.platform_configured(job.strategies())
            args = (
                configured,
                reported,
                [f.fault_type for f in faults],
                [f.level for f in faults],
                pod0,
            )
            choice = forced or strat.choose(*args, allowed, in_place=bool(self.st.restart_proc_pods))
            if forced is None and choice.strategy == "elastic-training" and job.rescheduling():
                # canChooseScaleInStrategy: with rescheduling configured, scale in only when the
                # resources do not come back within MINDIO_WAIT_MINDX_TIME - 10 s
                if await self.resched.wait_resources(flow, job):
                    choice = strat.choose(
                        *args, allowed, in_place=bool(self.st.restart_proc_pods), elastic_ok=False
                    )
            forced = None
            if (
                choice.strategy == "recover"
                and self.platform.platform_mode()
                and not await self.platform.wait_rank_table(flow)
            ):
                # the reference re-reads the platform's strategy and chooses dump or exit
                s = self.platform.read_strategy(True)
                if s is None:
                    await self.c.fault_retry(flow, "platform strategy unreadable after RankTableReady failed")
                self.st.plat_strategy = s
                choice = strat.choose(
                    self.platform.platform_configured(job.strategies()),
                    reported,
                    *args[2:],
                    strat.AFTER_FAILURE["recover"],
                )
            if choice.strategy not in ("retry", "recover-in-place"):
                self.in_place.drop_in_place()  # every fault pod restarts as a pod
            if choice.strategy != "retry":  # retry not chosen: retry faults become normal faults
                faults = self.c.expand_to_pods(keep=self.st.restart_proc_pods)
            self.c.decide(
                flow,
                choice.strategy,
                choice.reason,
                faults=faults,
                trigger=trigger,
                reported=sorted(reported),
            )
            ok, code = await self.run_strategy(flow, choice)
            if ok:
                return "done"
            if code == RESCHEDULE_TIMEOUT:
                # NeedTryScaleInStrategy -> NotifyScaleInStrategy
                if self.resched.elastic_supported(job, reported):
                    forced = strat.Choice(
                        "elastic-training",
                        "downgrade",
                        '{"scale-in-strategy": "DP"}',
                        f"{self.st.no_status}: scale-in",
                    )
                    allowed = strat.AFTER_FAILURE[choice.strategy]
                    continue
                await self.c.fault_retry(flow, self.st.no_status)
            if code is None:
                await self.c.fault_retry(flow, self.st.no_status)
            self.c.decide(flow, f"{choice.strategy}-failed", f"status code {code}")
            if choice.strategy == "retry":
                if code == 405:
                    return "again"
                reported.discard("recover")  # §7.3 step 6: recover is removed ("dump" too on 499)
                if code == 499:
                    reported.discard("dump")
                self.c.expand_to_pods()  # KillPodForUnrecoverableRetry: the fault list, all normal
            allowed = strat.AFTER_FAILURE[choice.strategy]
            if choice.strategy == "exit":
                return "done"

    def _strategy_signal(self, s: str) -> tuple[list[RankFault], list[str]]:
        """faultRanks and nodeRankIds of ``changeStrategy s`` (the reference's
        handleDecidedStrategyAfterChoose): retry -> the retry faults; every other strategy -> the
        cached normal faults; nodeRankIds -> their pod ranks."""
        faults = self.st.faults()
        if s == "retry":
            faults = [f for f in faults if f.fault_type in ("0", "2")] or faults
        if s == "recover-in-place":  # TaskD restarts the workers of these pods only
            return faults, [str(p) for p in sorted(self.st.restart_proc_pods)]
        return faults, pod_ranks(faults)

    async def run_strategy(self, flow: str, choice: strat.Choice) -> tuple[bool, int | None]:
        """Send ``changeStrategy`` and wait for its status. Returns (success, status code or None
        when it was not sent or no status came; the state's ``no_status`` says which)."""
        s = choice.strategy
        if s == "exit":
            self.c.set_state(states.NOTIFY_DECIDED_STRATEGY)
            faults, pods = self._strategy_signal(s)
            if not await self.io.signal(
                "changeStrategy",
                self.in_place.in_place_actions(s),
                faults,
                change_strategy="exit",
                node_rank_ids=pods,
            ):
                self.st.no_status = "changeStrategy exit not delivered"
                return False, None
            self.c.set_state(states.CHECK_RECOVER_RESULT)
            self.c.decide(flow, "exit-completed", self._after_exit())
            return True, 0
        if s == "dump":  # dump_and_exit ends with exit either way: nothing left to fall back to
            await self.dump_and_exit(flow, "changeStrategy")
            return True, 0
        state = {
            "retry": states.WAIT_REPORT_STEP_RETRY_STATUS,
            "recover": states.WAIT_REPORT_PROCESS_RECOVER_STATUS,
            "recover-in-place": states.WAIT_REPORT_PROCESS_RECOVER_STATUS,
            "elastic-training": states.WAIT_REPORT_SCALE_IN_ISOLATE_RANKS,
        }[s]
        if s == "retry" and any(f.fault_type == "2" for f in self.st.faults()):
            await asyncio.sleep(self.c.t.hccl_route_s)  # HCCL route convergence
        self.c.set_state(states.NOTIFY_DECIDED_STRATEGY)
        self.io.expect("status")
        actions = self.in_place.in_place_actions(s)
        faults, pods = self._strategy_signal(s)
        if not await self.io.signal(
            "changeStrategy", actions, faults, change_strategy=choice.signal, extra=choice.extra,
            node_rank_ids=pods,
        ):  # fmt: skip
            self.st.no_status = f"changeStrategy {choice.signal} not delivered"
            return False, None
        self.c.set_state(state)
        what, rep = await self.resched.wait_status_rescheduled(s)
        if what == "reschedule-timeout":
            self.st.no_status = f"fault pods not rescheduled in {rep}s (wait-reschedule-timeout)"
            return False, RESCHEDULE_TIMEOUT
        if what == "timeout":
            self.st.no_status = f"no {s} status reported in {self.c.t.report_s}s"
            return False, None
        code = rep.status.code
        if s == "elastic-training":
            done = await self.elastic.run(flow, rep)
            if done == NEW_FAULT:
                await self.run("fault during scale-in")
                raise FlowEnd
            return done
        if code == 0:
            self.c.decide(flow, f"{s}-success", "training side reported status 0")
            self.st.cached_faults.clear()
            return True, 0
        return False, code

    async def dump_and_exit(self, flow: str, how: str) -> bool:
        """Dump (``saveAndExit`` or ``changeStrategy dump``), then ``changeStrategy exit`` dump_exit.
        A dump signal that cannot be sent or a dump status that never comes -> FaultClear / FaultRetry."""
        self.c.set_state(states.NOTIFY_DUMP)
        self.io.expect("status")
        faults = self.c.expand_to_pods() if how != "saveAndExit" else self.st.faults()
        pods = pod_ranks(faults)
        if how == "saveAndExit":
            ok = await self.io.signal("saveAndExit", ["save_and_exit"], faults, node_rank_ids=pods)
        else:
            ok = await self.io.signal(
                "changeStrategy", self.in_place.in_place_actions("dump"), faults, change_strategy="dump",
                node_rank_ids=pods,
            )  # fmt: skip
        if not ok:
            await self.c.fault_retry(flow, "dump signal not delivered")
        self.c.set_state(states.WAIT_REPORT_DUMP_STATUS)
        r = await self.io.wait("status")
        if r is None:
            self.c.decide(flow, "dump-failed", f"dump status not reported in {self.c.t.report_s}s")
            await self.c.fault_retry(flow, "dump timed out")
        success = r[1].status.code == 0
        self.c.decide(flow, "dump-success" if success else "dump-failed", f"status {r[1].status.code}")
        await self.c.dump_exit()
        self.c.set_state(states.CHECK_RECOVER_RESULT)
        # after_dump: ProcessRecoverStatus stays dump-success / dump-failed (the reference)
        self.c.decide(flow, "exit-completed", self._after_exit(), after_dump=True)
        self.st.cached_faults.clear()
        return success

    def _after_exit(self) -> str:
        job = self.c.job()
        if job and job.rescheduling():
            return (
                f"processes exited; {'/'.join(job.rescheduling())} restarts the job away from the fault nodes"
            )
        return "processes exited; no rescheduling configured, the job stops"
