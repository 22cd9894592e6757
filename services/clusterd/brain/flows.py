"""Fault recovery flows of the per-job controller (clusterd.md §7.2, §4): stop training, collect
the reports, choose a strategy (:mod:`.strategy`) and run it, dump-and-exit, elastic training.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import SimpleNamespace

from clusterd.brain import strategy as strat
from clusterd.brain.ctlbase import INIT, FlowEnd, _normal
from clusterd.brain.faultview import RankFault
from clusterd.brain.inplace import InPlaceSteps
from clusterd.brain.platform import PlatformSteps
from clusterd.brain.reschedule import RescheduleSteps
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.brain")


RESCHEDULE_TIMEOUT = -1  # run_strategy's code: the fault pods were not rescheduled in time


class RecoveryFlows(InPlaceSteps, RescheduleSteps, PlatformSteps):
    """The fault recovery flow of :class:`clusterd.brain.controller.Controller`."""

    async def recovery(self, trigger: str) -> None:
        """The main path of §7.3 for the cached faults (run inside a flow)."""
        job = self.ports.jobs.get(self.job_id)
        if job is None:
            raise FlowEnd
        flow = "recovery"
        configured = job.strategies()
        faults = self.faults()
        self.set_state("NotifyWaitFaultFlushing")
        if self.platform_mode():  # the AI platform decides (platform mode)
            await self.wait_platform_strategy(flow)
            dump_only = self.plat_strategy == "dump" and "dump" in configured
        else:
            dump_only = [s for s in configured if s != "exit"] == ["dump"]
        if dump_only:
            self.ports.decide(self.job_id, flow, "dump", "dump is the only strategy", faults=faults)
            await self.dump_and_exit(flow, "saveAndExit")
            return
        self.set_state("NotifyStopTrain")
        self.expect("stop")
        if not await self.signal("stopTrain", ["stop_train"], faults, new_id=True):
            await self.fault_retry(flow, "stopTrain not delivered")
        self.set_state("WaitReportStopComplete")
        r = await self.wait("stop")
        if r is None:
            await self.fault_retry(flow, f"stop complete not reported in {self.t.report_s}s")
        rep = r[1]
        if rep.status.code == 404:
            await self.kill_job(flow, "processes not ready (ReportStopComplete 404)")
        self._merge_reported(rep.faultRanks)
        await self.global_fault_and_decide(flow, trigger)

    async def global_fault_and_decide(self, flow: str, trigger: str) -> None:
        """WaitFaultFlushFinished -> NotifyGlobalFault -> WaitReportRecoverStrategy -> the strategy
        (§7.3 steps 3-6). A retry answered 405 comes back here with its faults made normal."""
        retried = False
        while True:
            job = self.ports.jobs.get(self.job_id)
            configured = self.platform_configured(job.strategies() if job else [])
            faults = self.faults()
            self.set_state("WaitFaultFlushFinished")
            retry_types = bool(faults) and all(f.fault_type in ("0", "2") for f in faults)
            retry_only = retry_types and "retry" in configured and not retried
            if not (retry_only and all(f.fault_type == "0" for f in faults)):
                await asyncio.sleep(self.t.flush_s)
            self.set_state("NotifyGlobalFault")
            if retry_only and self.platform_mode():
                merged = await self.confirm_faults(flow, [(str(f.rank), f.fault_type) for f in faults])
                self._merge_reported([SimpleNamespace(rankId=r, faultType=t) for r, t in merged])
                retry_only = all(t in ("0", "2") for _, t in merged)  # else the normal-fault case
            if retry_only:
                self.expect("strategy")
                faults = self.faults()
                timeout = 33 if any(f.fault_type == "2" for f in faults) else 0
                ok = await self.signal("globalFault", ["on_global_rank"], faults, sig_timeout=timeout)
            else:
                await self.split_in_place(flow, configured)
                if self.platform_mode() and not retry_types:
                    pairs = [(str(f.rank), "1") for f in self.faults()]
                    merged = await self.confirm_faults(flow, pairs)
                    self._merge_reported([SimpleNamespace(rankId=r, faultType="1") for r, _ in merged])
                self.set_state("NotifyGlobalFault")
                self.expect("strategy")
                faults = self.expand_to_pods(keep=self.restart_proc_pods)
                exit_pods = [p for p in self._pod_ranks(faults) if int(p) not in self.restart_proc_pods]
                # the reference: fault_nodes_exit, nodeRankIds = the pods that restart as pods (none
                # when every fault pod restarts its processes in place)
                ok = await self.signal(
                    "globalFault", ["on_global_rank", "fault_nodes_exit"], faults, node_rank_ids=exit_pods
                )
            if not ok:
                await self.kill_job(flow, "globalFault not delivered")
            self.set_state("WaitReportRecoverStrategy")
            self.resched_started = time.monotonic()  # the reference starts listenScheduleResult here
            r = await self.wait("strategy")
            if r is None:
                await self.fault_retry(flow, f"recover strategy not reported in {self.t.report_s}s")
            self.agent_strategies = list(r[1].strategies)
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
        if self.state == INIT and not self.busy():
            with contextlib.suppress(TimeoutError):
                await wait_for(self.flow_began.wait(), self.t.pre_exit_wait_s)
        job = jobs.get(self.job_id)
        kept = [f for f in faults if job is not None and job.pod_rank(f.node) == f.pod_rank]
        decide = self.ports.decide
        if not kept:
            decide(self.job_id, "recovery", "pre-exit-skipped", "every fault pod was replaced", faults=faults)
            return False
        await self.stop_train_released()
        normal = [_normal(f) for f in kept]
        ok = await self.signal(
            "preExitProcess", ["pre exit process"], normal, node_rank_ids=self._pod_ranks(normal), own_id=True
        )
        decide(
            self.job_id, "recovery", "pre-exit", reason if ok else "preExitProcess not delivered", faults=normal,
        )  # fmt: skip
        return ok

    def _merge_reported(self, ranks) -> None:
        job = self.ports.jobs.get(self.job_id)
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

    async def decide_and_run(self, flow: str, trigger: str, after_retry: bool = False) -> str:
        """Choose strategies with fallback until one succeeds or exit ran (§7.3 steps 5-6).

        Returns "done", or "again" when a retry was answered 405 (RecoverableRetryError: back to
        globalFault with ``fault_nodes_exit``). A status that never comes or a changeStrategy that
        cannot be sent ends in FaultClear / FaultRetry (:meth:`fault_retry`)."""
        job = self.ports.jobs.get(self.job_id)
        if job is None:
            raise FlowEnd
        allowed: tuple[str, ...] = strat.AFTER_FAILURE["retry"] if after_retry else strat.ORDER
        reported = set(self.agent_strategies)
        forced: strat.Choice | None = None
        while True:
            faults = self.faults()
            pod0 = any(f.pod_rank == 0 for f in faults)
            configured = self.platform_configured(job.strategies())
            args = (
                configured,
                reported,
                [f.fault_type for f in faults],
                [f.level for f in faults],
                pod0,
            )
            choice = forced or strat.choose(*args, allowed, in_place=bool(self.restart_proc_pods))
            if forced is None and choice.strategy == "elastic-training" and job.rescheduling():
                # canChooseScaleInStrategy: with rescheduling configured, scale in only when the
                # resources do not come back within MINDIO_WAIT_MINDX_TIME - 10 s
                if await self.wait_resources(flow, job):
                    choice = strat.choose(
                        *args, allowed, in_place=bool(self.restart_proc_pods), elastic_ok=False
                    )
            forced = None
            if choice.strategy == "recover" and self.platform_mode() and not await self.wait_rank_table(flow):
                # the reference re-reads the platform's strategy and chooses dump or exit
                s = self.read_strategy(True)
                if s is None:
                    await self.fault_retry(flow, "platform strategy unreadable after RankTableReady failed")
                self.plat_strategy = s
                choice = strat.choose(
                    self.platform_configured(job.strategies()),
                    reported,
                    *args[2:],
                    strat.AFTER_FAILURE["recover"],
                )
            if choice.strategy not in ("retry", "recover-in-place"):
                self.drop_in_place()  # every fault pod restarts as a pod
            if choice.strategy != "retry":  # retry not chosen: retry faults become normal faults
                faults = self.expand_to_pods(keep=self.restart_proc_pods)
            self.ports.decide(
                self.job_id, flow, choice.strategy, choice.reason, faults=faults, trigger=trigger,
                reported=sorted(reported),
            )  # fmt: skip
            ok, code = await self.run_strategy(flow, choice)
            if ok:
                return "done"
            if code == RESCHEDULE_TIMEOUT:
                if self.elastic_supported(job, reported):  # NeedTryScaleInStrategy -> NotifyScaleInStrategy
                    forced = strat.Choice(
                        "elastic-training",
                        "downgrade",
                        '{"scale-in-strategy": "DP"}',
                        f"{self._no_status}: scale-in",
                    )
                    allowed = strat.AFTER_FAILURE[choice.strategy]
                    continue
                await self.fault_retry(flow, self._no_status)
            if code is None:
                await self.fault_retry(flow, self._no_status)
            self.ports.decide(self.job_id, flow, f"{choice.strategy}-failed", f"status code {code}")
            if choice.strategy == "retry":
                if code == 405:
                    return "again"
                reported.discard("recover")  # §7.3 step 6: recover is removed ("dump" too on 499)
                if code == 499:
                    reported.discard("dump")
                self.expand_to_pods()  # KillPodForUnrecoverableRetry: the fault list, all normal
            allowed = strat.AFTER_FAILURE[choice.strategy]
            if choice.strategy == "exit":
                return "done"

    def _strategy_signal(self, s: str) -> tuple[list[RankFault], list[str]]:
        """faultRanks and nodeRankIds of ``changeStrategy s`` (the reference's
        handleDecidedStrategyAfterChoose): retry -> the retry faults; every other strategy -> the
        cached normal faults; nodeRankIds -> their pod ranks."""
        faults = self.faults()
        if s == "retry":
            faults = [f for f in faults if f.fault_type in ("0", "2")] or faults
        if s == "recover-in-place":  # TaskD restarts the workers of these pods only
            return faults, [str(p) for p in sorted(self.restart_proc_pods)]
        return faults, self._pod_ranks(faults)

    async def run_strategy(self, flow: str, choice: strat.Choice) -> tuple[bool, int | None]:
        """Send ``changeStrategy`` and wait for its status. Returns (success, status code or None
        when it was not sent or no status came; :attr:`_no_status` says which)."""
        s = choice.strategy
        if s == "exit":
            self.set_state("NotifyDecidedStrategy")
            faults, pods = self._strategy_signal(s)
            if not await self.signal(
                "changeStrategy", self.in_place_actions(s), faults, change_strategy="exit", node_rank_ids=pods
            ):
                self._no_status = "changeStrategy exit not delivered"
                return False, None
            self.set_state("CheckRecoverResult")
            self.ports.decide(self.job_id, flow, "exit-completed", self._after_exit())
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
        if s == "retry" and any(f.fault_type == "2" for f in self.faults()):
            await asyncio.sleep(self.t.hccl_route_s)  # HCCL route convergence
        self.set_state("NotifyDecidedStrategy")
        self.expect("status")
        actions = self.in_place_actions(s)
        faults, pods = self._strategy_signal(s)
        if not await self.signal(
            "changeStrategy", actions, faults, change_strategy=choice.signal, extra=choice.extra,
            node_rank_ids=pods,
        ):  # fmt: skip
            self._no_status = f"changeStrategy {choice.signal} not delivered"
            return False, None
        self.set_state(state)
        what, rep = await self.wait_status_rescheduled(s)
        if what == "reschedule-timeout":
            self._no_status = f"fault pods not rescheduled in {rep}s (wait-reschedule-timeout)"
            return False, RESCHEDULE_TIMEOUT
        if what == "timeout":
            self._no_status = f"no {s} status reported in {self.t.report_s}s"
            return False, None
        code = rep.status.code
        if s == "elastic-training":
            return await self._elastic(flow, rep)
        if code == 0:
            self.ports.decide(self.job_id, flow, f"{s}-success", "training side reported status 0")
            self.cached_faults.clear()
            return True, 0
        return False, code

    async def fault_retry(self, flow: str, reason: str) -> None:
        """FaultClear then FaultRetry (§7.3 step 7): process-recover-enable=pause, ``changeStrategy
        exit`` dump_exit to the fault pods, wait up to ``fault_retry_s`` for the job to run, label
        back to ``on``. A job that does not run again is killed (killMaster). Ends the flow."""
        self.set_state("FaultClear")
        self.ports.decide(self.job_id, flow, "fault-clear", reason)
        self.set_state("FaultRetry")
        await self.ports.jobs.update(self.job_id, process_recover_enable="pause")
        await self._dump_exit()
        deadline = time.monotonic() + self.t.fault_retry_s
        while True:
            job = self.ports.jobs.get(self.job_id)
            if job is None:
                raise FlowEnd
            if job.status == "running":
                break
            if time.monotonic() >= deadline:
                await self.kill_job(flow, f"job not running {self.t.fault_retry_s}s after FaultRetry")
            await asyncio.sleep(self.t.poll_s)
        await self.ports.jobs.update(self.job_id, process_recover_enable="on")
        self.ports.decide(
            self.job_id, flow, "fault-retry", "processes told to exit (dump_exit); the job runs again"
        )
        raise FlowEnd

    async def _dump_exit(self) -> bool:
        """``changeStrategy exit`` with extraParams ``dump_exit`` and nodeRankIds = the fault pods
        (the reference's sendDumpExit: no faultRanks)."""
        pods = self._pod_ranks(self.expand_to_pods())
        return await self.signal(
            "changeStrategy",
            ["change_strategy"],
            change_strategy="exit",
            extra="dump_exit",
            node_rank_ids=pods,
        )

    async def _elastic(self, flow: str, rep) -> tuple[bool, int | None]:
        """Elastic training (DP scale-in, then scale-out when the fault ranks are healthy again)."""
        if rep.status.code == 201:
            isolate = []
            job = self.ports.jobs.get(self.job_id)
            for rid in rep.isolateRankIds:
                node = job.node_of_rank(int(rid)) if job and rid.isdigit() else None
                if node is not None:
                    isolate.append(str(job.pod_rank(node)))
            # handleCheckScaleStrategyRecoverResult -> RemoveDuplicateNodeRanks: the fault pods
            # exited at the globalFault already; only the pods MindIO isolates besides them exit now
            exited = set(self._pod_ranks(self.faults()))
            self.expect("status")
            await self.signal(
                "faultNodesExit", ["fault_nodes_exit"], node_rank_ids=sorted(set(isolate) - exited, key=int)
            )
            r = await self.wait("status")
            if r is None:
                return False, None
            rep = r[1]
        if rep.status.code != 0:
            return False, rep.status.code
        self.set_state("ScaleInRunning")
        self.ports.decide(self.job_id, flow, "scale-in-success", "training continues on fewer DP groups")
        scaled = {k[0] for k in self.cached_faults}
        deadline = time.monotonic() + self.t.scale_wait_s
        while time.monotonic() < deadline:
            if {k[0] for k in self.cached_faults} - scaled:
                # §7.3 elastic step 4: a new fault during ScaleInRunning -> NotifyStopTrain
                self.ports.decide(
                    self.job_id, flow, "stop-train", "new fault during ScaleInRunning", faults=self.faults()
                )
                await self.recovery("fault during scale-in")
                raise FlowEnd
            if not self.current_faults(self.cached_faults):
                break
            await asyncio.sleep(self.t.poll_s)
        else:
            self.ports.decide(
                self.job_id, flow, "scale-in-kept", f"fault ranks not healthy within {self.t.scale_wait_s}s"
            )
            return True, 0
        self.expect("status")
        faults, pods = self._strategy_signal("upgrade")
        await self.signal(
            "changeStrategy",
            ["change_strategy"],
            faults,
            change_strategy="upgrade",
            extra='{"scale-out-strategy": "DP"}',
            node_rank_ids=pods,
        )
        r = await self.wait("status")
        if r is None or r[1].status.code != 0:
            return False, None if r is None else r[1].status.code
        self.ports.decide(self.job_id, flow, "scale-out-success", "fault ranks healthy again")
        self.cached_faults.clear()
        return True, 0

    async def dump_and_exit(self, flow: str, how: str) -> bool:
        """Dump (``saveAndExit`` or ``changeStrategy dump``), then ``changeStrategy exit`` dump_exit.
        A dump signal that cannot be sent or a dump status that never comes -> FaultClear / FaultRetry."""
        self.set_state("NotifyDump")
        self.expect("status")
        faults = self.expand_to_pods() if how != "saveAndExit" else self.faults()
        pods = self._pod_ranks(faults)
        if how == "saveAndExit":
            ok = await self.signal("saveAndExit", ["save_and_exit"], faults, node_rank_ids=pods)
        else:
            ok = await self.signal(
                "changeStrategy", self.in_place_actions("dump"), faults, change_strategy="dump",
                node_rank_ids=pods,
            )  # fmt: skip
        if not ok:
            await self.fault_retry(flow, "dump signal not delivered")
        self.set_state("WaitReportDumpStatus")
        r = await self.wait("status")
        if r is None:
            self.ports.decide(
                self.job_id, flow, "dump-failed", f"dump status not reported in {self.t.report_s}s"
            )
            await self.fault_retry(flow, "dump timed out")
        success = r[1].status.code == 0
        self.ports.decide(
            self.job_id, flow, "dump-success" if success else "dump-failed", f"status {r[1].status.code}"
        )
        await self._dump_exit()
        self.set_state("CheckRecoverResult")
        # after_dump: ProcessRecoverStatus stays dump-success / dump-failed (the reference)
        self.ports.decide(self.job_id, flow, "exit-completed", self._after_exit(), after_dump=True)
        self.cached_faults.clear()
        return success

    def _after_exit(self) -> str:
        job = self.ports.jobs.get(self.job_id)
        if job and job.rescheduling():
            return (
                f"processes exited; {'/'.join(job.rescheduling())} restarts the job away from the fault nodes"
            )
        return "processes exited; no rescheduling configured, the job stops"

    # -- NIC switch (§4.1) -------------------------------------------------------------------------
