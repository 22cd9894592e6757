"""Fault recovery flows of the per-job controller (clusterd.md §7.2, §4): stop training, collect
the reports, choose a strategy (:mod:`.strategy`) and run it, dump-and-exit, elastic training.
"""

from __future__ import annotations

import asyncio
import logging
import time

from clusterd.brain import strategy as strat
from clusterd.brain.ctlbase import (
    ControllerBase,
    FlowEnd,
    _normal,
)
from clusterd.brain.faultview import RankFault

log = logging.getLogger("clusterd.brain")


class RecoveryFlows(ControllerBase):
    """The fault recovery flow of :class:`clusterd.brain.controller.Controller`."""

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
