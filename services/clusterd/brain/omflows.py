"""O&M flows of the per-job controller (clusterd.md §7.4-7.5): NIC switch and stress test. Both
pause the training (``stopTrain`` pause_train), push their request on the O&M notify stream, wait for
its result and continue (``changeStrategy continue``); a failure turns the ranks into faults and runs
the fault recovery. The sub-health hot switch is :mod:`.hotswitch`; graceExit is a preExitProcess,
then the recovery flow's dump (:mod:`.intake`).
"""

from __future__ import annotations

import json
import logging
import time

from clusterd.brain import states
from clusterd.brain.ctlcore import ControllerCore
from clusterd.brain.faultview import RankFault
from clusterd.brain.flows import RecoveryFlow
from faultmesh._pb import recover_pb2
from faultmesh.model import now_ms

log = logging.getLogger("clusterd.brain")


class OmFlows:
    """The NIC switch and stress test flows over the controller core ``c``; a failed operation turns
    its ranks into faults for ``recovery`` (the fault recovery flow)."""

    def __init__(self, c: ControllerCore, recovery: RecoveryFlow) -> None:
        self.c = c
        self.st = c.st
        self.io = c.io
        self.recovery = recovery

    async def nic_switch(self, ranks: list[str], ops: list[bool]) -> None:
        """Pause → SwitchRankList → result → continue (or normal recovery / kill job)."""
        flow = "switch-nic"
        try:
            await self._pause(flow)
            self.c.set_state(states.NOTIFY_SWITCH_NIC)
            self.io.expect("switch", "status")
            msg = recover_pb2.SwitchRankList(rankID=ranks, op=ops, jobId=self.c.job_id)
            if not await self.io.push_notify("nic", msg):
                self.io.finish_om("om failed, send signal failed")
                await self.c.kill_job(flow, "SwitchRankList not delivered (no SubscribeNotifySwitch stream)")
            self.c.set_state(states.WAIT_SWITCH_NIC_FINISHED)
            r = await self.io.wait("switch", "status")
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
                self.io.finish_om(f"switch nic failed, {failed}")
                self.c.decide(flow, "stop-train", failed)
                job = self.c.job()
                self.st.add_faults(rank_faults_for(job, [int(x) for x in ranks]))
                await self.recovery.run(flow)
                return
            await self._continue(flow)
            self.io.finish_om("switch nic finish")
            self.c.decide(flow, "switch-nic-success", f"ranks {','.join(ranks)} switched")
        finally:
            self.io.finish_om("om failed, switch nic interrupted")

    async def _pause(self, flow: str) -> None:
        self.c.set_state(states.NOTIFY_PAUSE_TRAIN)
        self.io.expect("stop")
        timeout = 900 if self.st.om_kind == "stress" else 0
        if not await self.io.signal("stopTrain", ["pause_train"], sig_timeout=timeout, new_id=True):
            self.io.finish_om("om failed, send signal failed")
            await self.c.kill_job(flow, "pause_train not delivered")
        self.c.set_state(states.WAIT_REPORT_PAUSE_COMPLETE)
        r = await self.io.wait("stop")
        if r is None:
            self.io.finish_om("pause train timeout")
            await self.c.kill_job(flow, f"pause not reported in {self.c.t.report_s}s")
        if r[1].status.code == 499:
            self.io.finish_om("pause train failed")
            await self.c.kill_job(flow, "pause failed (499)")

    async def _continue(self, flow: str) -> None:
        self.c.set_state(states.NOTIFY_CONTINUE_TRAIN)
        self.io.expect("status")
        if not await self.io.signal("changeStrategy", ["change_strategy"], change_strategy="continue"):
            self.io.finish_om("om failed, send signal failed")
            await self.c.kill_job(flow, "continue not delivered")
        self.c.set_state(states.WAIT_CONTINUE_TRAIN)
        r = await self.io.wait("status")
        if r is None or r[1].status.code == 499:
            self.io.finish_om("continue train failed" if r else "continue train timeout")
            await self.c.kill_job(flow, "continue not confirmed" if r is None else "continue failed (499)")

    # -- stress test (§4.2) ------------------------------------------------------------------------
    async def stress_test(self, params: dict[str, dict[str, list[int]]]) -> None:
        """``params``: node -> rank -> ops. Pause → test → continue, isolate (code 2) or recover (3/4)."""
        flow = "stress-test"
        try:
            await self._pause(flow)
            self.c.set_state(states.NOTIFY_STRESS_TEST)
            self.io.expect("stress", "status")
            flat = {
                rank: recover_pb2.StressOpList(ops=ops) for n in params.values() for rank, ops in n.items()
            }
            msg = recover_pb2.StressTestRankParams(stressParam=flat, jobId=self.c.job_id)
            if not await self.io.push_notify("stress", msg):
                self.io.finish_om("om failed, send signal failed")
                await self.c.kill_job(flow, "StressTestRankParams not delivered")
            self.c.set_state(states.WAIT_STRESS_TEST_FINISHED)
            self.st.hidden_nodes = set(params)
            await self.io.signal("pauseStartAgent", ["pause_start_agent"])
            fault_during = False
            deadline = time.monotonic() + self.c.t.report_s
            result = None
            while True:
                # keep: a status does not end the wait, and a result queued meanwhile stays (expect()
                # would clear its slot)
                left = max(0.0, deadline - time.monotonic())
                r = await self.io.wait("stress", "status", timeout_s=left, keep=True)
                if r is None:
                    break
                if r[0] == "status":
                    if r[1].status.code == 406:
                        fault_during = True
                        self.io.finish_om("recv fault, when stressing test")
                    continue
                result = r[1]
                break
            self.io.unexpect("stress", "status")
            self.st.hidden_nodes = set()
            await self.io.signal("continueStartAgent", ["continue_start_agent"])
            if result is None:
                self.io.finish_om("stress test timeout")
                self.c.decide(flow, "stop-train", "stress test result not reported")
                job = self.c.job()
                ranks = [int(r) for n in params.values() for r in n]
                self.st.add_faults(rank_faults_for(job, ranks))
                await self.recovery.run(flow)
                return
            await self._stress_result(flow, params, result, fault_during)
        finally:
            self.st.hidden_nodes = set()
            self.io.finish_om("om failed, stress test interrupted")

    async def _stress_result(self, flow, params, result, fault_during: bool) -> None:
        job = self.c.job()
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
            self.io.finish_om(f"stress test find fault, isolate node:{sorted(isolate)},result:{result_json}")
            self.c.decide(flow, "isolate-node", f"stress test code 2 on {sorted(isolate)}")
            await self.c.ports.isolate_nodes(self.c.job_id, sorted(isolate))
            fault_ranks += [r.rank for n in isolate for r in job.ranks_on(n)]
        elif fault_ranks:
            self.io.finish_om(
                f"stress test timeout fault, faultRank:{sorted(set(fault_ranks))},result:{result_json}"
            )
        if fault_ranks or isolate:
            self.c.decide(flow, "stop-train", f"stress test faults on ranks {sorted(set(fault_ranks))}")
            self.st.add_faults(rank_faults_for(job, sorted(set(fault_ranks))))
            await self.recovery.run(flow)
            return
        self.io.finish_om(
            ("stress test failed, " if fault_during else "") + "stress test finish, result:" + result_json
        )
        await self._continue(flow)
        self.c.decide(flow, "stress-test-success", "all ops returned code 0/1")


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
