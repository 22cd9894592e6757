"""O&M flows of the per-job controller (clusterd.md §7.3-7.5): NIC switch, stress test and
sub-health hot switch (graceExit is a preExitProcess, then the recovery flow's dump).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

from clusterd.brain.ctlbase import (
    ControllerBase,
    FlowEnd,
)
from clusterd.brain.faultview import RankFault
from faultmesh._pb import recover_pb2
from faultmesh.levels import SUB_HEALTHY, UNHEALTHY, level_health
from faultmesh.model import now_ms

log = logging.getLogger("clusterd.brain")


class OmFlows(ControllerBase):
    """The O&M flows of :class:`clusterd.brain.controller.Controller`."""

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
                self.ports.decide(self.job_id, flow, "stop-train", failed)
                job = self.ports.jobs.get(self.job_id)
                self.add_faults(rank_faults_for(job, [int(x) for x in ranks]))
                await self.recovery(flow)
                return
            await self._continue(flow)
            self._finish_om("switch nic finish")
            self.ports.decide(self.job_id, flow, "switch-nic-success", f"ranks {','.join(ranks)} switched")
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
                # keep: a status does not end the wait, and a result queued meanwhile stays (expect()
                # would clear its slot)
                left = max(0.0, deadline - time.monotonic())
                r = await self.wait("stress", "status", timeout_s=left, keep=True)
                if r is None:
                    break
                if r[0] == "status":
                    if r[1].status.code == 406:
                        fault_during = True
                        self._finish_om("recv fault, when stressing test")
                    continue
                result = r[1]
                break
            self._expect.discard("stress")
            self._expect.discard("status")
            self.hidden_nodes = set()
            await self.signal("continueStartAgent", ["continue_start_agent"])
            if result is None:
                self._finish_om("stress test timeout")
                self.ports.decide(self.job_id, flow, "stop-train", "stress test result not reported")
                job = self.ports.jobs.get(self.job_id)
                ranks = [int(r) for n in params.values() for r in n]
                self.add_faults(rank_faults_for(job, ranks))
                await self.recovery(flow)
                return
            await self._stress_result(flow, params, result, fault_during)
        finally:
            self.hidden_nodes = set()
            self._finish_om("om failed, stress test interrupted")

    async def _stress_result(self, flow, params, result, fault_during: bool) -> None:
        job = self.ports.jobs.get(self.job_id)
        isolate: set[str] = set()
        fault_ranks: list[int] = []
        table: dict[str, dict[str, dict[str, dict[str, dict[str, str]]]]] = {}
        for rank, rr in result.stressResult.items():
            node = job.node_of_rank(int(rank)) if job and rank.isdigit() else None
            if node is None:
                continue
            dev = next((str(r.device_id) for r in job.ranks if str(r.rank) == rank), rank)
            ops = table.setdefault(node, {}).setdefault(dev, {}).setdefault("rankResult", {})
            for op, res in rr.rankResult.items():
                # the reference marshals the StressTestRankResult itself: {"rankResult": {op: {...}}},
                # empty fields left out (omitempty)
                ops[op] = {k: v for k, v in (("code", res.code), ("result", res.result)) if v}
                if res.code == "2":
                    isolate.add(node)
                elif res.code in ("3", "4"):
                    fault_ranks.append(int(rank))
        result_json = json.dumps(table, sort_keys=True, separators=(",", ":"))
        if isolate:
            self._finish_om(f"stress test find fault, isolate node:{sorted(isolate)},result:{result_json}")
            self.ports.decide(self.job_id, flow, "isolate-node", f"stress test code 2 on {sorted(isolate)}")
            await self.ports.isolate_nodes(self.job_id, sorted(isolate))
            fault_ranks += [r.rank for n in isolate for r in job.ranks_on(n)]
        elif fault_ranks:
            self._finish_om(
                f"stress test timeout fault, faultRank:{sorted(set(fault_ranks))},result:{result_json}"
            )
        if fault_ranks or isolate:
            self.ports.decide(
                self.job_id, flow, "stop-train", f"stress test faults on ranks {sorted(set(fault_ranks))}"
            )
            self.add_faults(rank_faults_for(job, sorted(set(fault_ranks))))
            await self.recovery(flow)
            return
        self._finish_om(
            ("stress test failed, " if fault_during else "") + "stress test finish, result:" + result_json
        )
        await self._continue(flow)
        self.ports.decide(self.job_id, flow, "stress-test-success", "all ops returned code 0/1")

    # -- sub-health (§7.3 "Hot switch", principles doc 亚健康热切) ------------------------------------
    async def hot_switch(self, faults: list[RankFault]) -> None:
        """Switch the sub-healthy pod to a backup node; any failure falls back to job-level
        rescheduling and degrades the job's subHealthyStrategy to ignore."""
        flow = "hot-switch"
        job = self.ports.jobs.get(self.job_id)
        fault_nodes = sorted({f.node for f in faults})
        self.set_state("NotifyHotSwitch")
        # notifyPrepareHotSwitch: every rank of the fault pod, type "1" (normalFaultAssociateSameNodeRank);
        # MindIO waits for each of them in the backup pod and rebuilds their communication groups
        pod_ranks = [
            replace(f, rank=r.rank, device_id=r.device_id, fault_type="1")
            for f in {f.node: f for f in faults}.values()
            for r in (job.ranks_on(f.node) if job else ())
        ]
        if not await self.signal("hot-switch", ["hot switch"], pod_ranks or faults, new_id=True):
            await self._degrade(flow, "hot-switch signal not delivered")
            raise FlowEnd
        self.set_state("WaitNewPodRunning")
        backup = None
        deadline = time.monotonic() + self.t.hot_switch_wait_s
        while True:
            backup = self._pick_backup(job, len(fault_nodes))
            if backup or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(self.t.poll_s, max(0.0, deadline - time.monotonic())))
        if not backup:
            await self.signal("hot-switch", ["stop switch"], faults)
            await self._degrade(flow, "no backup node became ready (no healthy backupNodes)")
            raise FlowEnd
        self.expect("strategy")
        await self.signal("hot-switch", ["new pod running"], faults)
        self.set_state("WaitReportRecoverStrategy")
        r = await self.wait("strategy")
        if r is None or not [s for s in r[1].strategies if s != "exit"]:
            why = "pause not reported in time" if r is None else "training side can only exit"
            await self._degrade(flow, why)
            await self.kill_job(flow, f"hot switch stopped: {why}; job-level rescheduling")
        self.set_state("NotifyMigration")
        mapping = dict(zip(fault_nodes, backup, strict=False))
        self.expect("status")
        await self.signal("changeStrategy", ["change_strategy"], faults, change_strategy="migration")
        self.set_state("WaitReportMigrationStatus")
        r = await self.wait("status")
        if r is None or r[1].status.code != 0:
            why = "resume not reported in time" if r is None else f"resume failed ({r[1].status.code})"
            await self._degrade(flow, why)
            await self.kill_job(flow, f"hot switch failed: {why}; job-level rescheduling")
        await self._move_ranks(mapping)
        self.ports.decide(self.job_id, flow, "hot-switch-success", f"pods moved {mapping}")

    def _pick_backup(self, job, count: int) -> list[str] | None:
        """``count`` backup nodes of ``job`` that have no SubHealthy/UnHealthy fault and host no rank."""
        used = {r.node for j in self.ports.jobs.all() for r in j.ranks}
        ok = [
            n
            for n in job.backup_nodes
            if n not in used
            and all(
                level_health(f.level) not in (SUB_HEALTHY, UNHEALTHY) for f in self.ports.faults_of_node(n)
            )
        ]
        return ok[:count] if len(ok) >= count else None

    async def _degrade(self, flow: str, reason: str) -> None:
        """Sub-health handling falls back: subHealthyStrategy becomes ``ignore`` (principles 亚健康热切)."""
        await self.ports.jobs.update(self.job_id, sub_healthy_strategy="ignore")
        self.ports.decide(self.job_id, flow, "degrade-to-ignore", reason)

    async def _move_ranks(self, mapping: dict[str, str]) -> None:
        """Move every rank on each old node to its new node (hot switch done)."""
        job = self.ports.jobs.get(self.job_id)
        if job is None:
            return
        ranks = tuple(replace(r, node=mapping.get(r.node, r.node)) for r in job.ranks)
        await self.ports.jobs.update(self.job_id, ranks=ranks)


def rank_faults_for(job, ranks: list[int]) -> list[RankFault]:
    """Type-"1" RankFaults for ``ranks`` of ``job`` (O&M failures turn ranks into faults, §4)."""
    if job is None:
        return []
    now = now_ms()
    return [
        RankFault(r.rank, r.node, r.device_id, job.pod_rank(r.node), "", "SeparateNPU", "1", now)
        for r in job.ranks
        if r.rank in ranks
    ]
