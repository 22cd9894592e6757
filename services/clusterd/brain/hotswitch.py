"""The sub-health hot switch of the per-job controller (clusterd.md §7.3 "Hot switch", principles doc
亚健康热切; the reference's hotswitch handling).

A sub-healthy pod moves to a backup node while training pauses: ``hot-switch`` ["hot switch"] with
every rank of the fault pods, wait up to ``hot_switch_wait_s`` for the backup, ``hot-switch`` ["new
pod running"], the training side's strategy report, ``changeStrategy migration`` and its status;
then the ranks move to the backup nodes. The backup is, in Kubernetes mode, the pod the Ascend
Operator creates for the (first) fault pod, Running (the controller's pod port,
:class:`clusterd.kube.podport.KubePods`: the reference's notifyCreateNewPod, then notifyDeleteOldPod
before the migration -- state ``WaitOldPodDeleted`` -- and the annotations cleaned after success or
failure); standalone, healthy unused nodes of the job's ``backupNodes``. Any failure degrades the job's
subHealthyStrategy to ``ignore`` (and kills the job for job-level rescheduling once it paused).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from clusterd.brain import states
from clusterd.brain.ctlcore import ControllerCore
from clusterd.brain.ctlstate import FlowEnd
from clusterd.brain.faultview import RankFault
from faultmesh.levels import SUB_HEALTHY, UNHEALTHY, level_health


class HotSwitchFlow:
    """The hot switch flow (module docstring) over the controller core ``c``."""

    def __init__(self, c: ControllerCore) -> None:
        self.c = c
        self.io = c.io

    async def run(self, faults: list[RankFault]) -> None:
        """Switch the sub-healthy pod to a backup node; any failure falls back to job-level
        rescheduling and degrades the job's subHealthyStrategy to ignore. A flow that ends another
        way (cancelled by a controller reset, a handler error) still has its backup-pod annotations
        cleaned, in a task of its own (the cancelled flow may not wait)."""
        try:
            await self._run(faults)
        except BaseException:  # every end of its own (success, failure) has cleaned already
            pods = self.c.ports.pods
            if pods is not None and pods.switching(self.c.job_id):
                self.c.ports.spawn(
                    pods.end_switch(self.c.job_id, ok=False, cancelled=True),
                    f"hot-switch-clean-{self.c.job_id}",
                )
            raise

    async def _run(self, faults: list[RankFault]) -> None:
        flow = "hot-switch"
        job = self.c.job()
        fault_nodes = sorted({f.node for f in faults})
        self.c.set_state(states.NOTIFY_HOT_SWITCH)
        # notifyPrepareHotSwitch: every rank of the fault pod, type "1" (normalFaultAssociateSameNodeRank);
        # MindIO waits for each of them in the backup pod and rebuilds their communication groups
        pod_ranks = [
            replace(f, rank=r.rank, device_id=r.device_id, fault_type="1")
            for f in {f.node: f for f in faults}.values()
            for r in (job.ranks_on(f.node) if job else ())
        ]
        if not await self.io.signal("hot-switch", ["hot switch"], pod_ranks or faults, new_id=True):
            await self._degrade(flow, "hot-switch signal not delivered")
            raise FlowEnd
        self.c.set_state(states.WAIT_NEW_POD_RUNNING)
        pods = self.c.ports.pods
        if pods is not None:  # Kubernetes: the Operator's backup pod (notifyCreateNewPod, one pod)
            fault_nodes = fault_nodes[:1]
            node = await pods.request_backup(self.c.job_id, fault_nodes[0], self.c.t.hot_switch_wait_s)
            backup = [node] if node else None
            why = "the Operator's backup pod did not run in time"
        else:
            backup = await self._wait_backup_nodes(job, len(fault_nodes))
            why = "no backup node became ready (no healthy backupNodes)"
        if not backup:
            await self.io.signal("hot-switch", ["stop switch"], faults)
            await self._failed(flow, why)
            raise FlowEnd
        self.io.expect("strategy")
        await self.io.signal("hot-switch", ["new pod running"], faults)
        self.c.set_state(states.WAIT_REPORT_RECOVER_STRATEGY)
        r = await self.io.wait("strategy")
        if r is None or not [s for s in r[1].strategies if s != "exit"]:
            why = "pause not reported in time" if r is None else "training side can only exit"
            await self._failed(flow, why)
            await self.c.kill_job(flow, f"hot switch stopped: {why}; job-level rescheduling")
        if pods is not None:  # notifyDeleteOldPod: Volcano deletes the fault pod, then migration
            self.c.set_state(states.WAIT_OLD_POD_DELETED)
            if not await pods.delete_old_pod(self.c.job_id, self.c.t.hot_switch_wait_s):
                await self._failed(flow, "the fault pod was not deleted in time")
                await self.c.kill_job(
                    flow, "hot switch failed: fault pod not deleted; job-level rescheduling"
                )
        self.c.set_state(states.NOTIFY_MIGRATION)
        mapping = dict(zip(fault_nodes, backup, strict=False))
        self.io.expect("status")
        await self.io.signal("changeStrategy", ["change_strategy"], faults, change_strategy="migration")
        self.c.set_state(states.WAIT_REPORT_MIGRATION_STATUS)
        r = await self.io.wait("status")
        if r is None or r[1].status.code != 0:
            why = "resume not reported in time" if r is None else f"resume failed ({r[1].status.code})"
            await self._failed(flow, why)
            await self.c.kill_job(flow, f"hot switch failed: {why}; job-level rescheduling")
        if pods is not None:
            await pods.end_switch(self.c.job_id, ok=True)  # cleanStateWhenSuccess
        await self._move_ranks(mapping)
        self.c.decide(flow, "hot-switch-success", f"pods moved {mapping}")

    async def _wait_backup_nodes(self, job, count: int) -> list[str] | None:
        """Standalone: wait up to ``hot_switch_wait_s`` for ``count`` usable ``backupNodes``."""
        deadline = time.monotonic() + self.c.t.hot_switch_wait_s
        while True:
            backup = self._pick_backup(job, count)
            if backup or time.monotonic() >= deadline:
                return backup
            await asyncio.sleep(min(self.c.t.poll_s, max(0.0, deadline - time.monotonic())))

    async def _failed(self, flow: str, reason: str) -> None:
        """cleanStateWhenFailed: Kubernetes mode's backup-pod annotations undone, then degrade."""
        if self.c.ports.pods is not None:
            await self.c.ports.pods.end_switch(self.c.job_id, ok=False)
        await self._degrade(flow, reason)

    def _pick_backup(self, job, count: int) -> list[str] | None:
        """``count`` backup nodes of ``job`` that have no SubHealthy/UnHealthy fault and host no rank."""
        used = {r.node for j in self.c.ports.jobs.all() for r in j.ranks}
        ok = [
            n
            for n in job.backup_nodes
            if n not in used
            and all(
                level_health(f.level) not in (SUB_HEALTHY, UNHEALTHY) for f in self.c.ports.faults_of_node(n)
            )
        ]
        return ok[:count] if len(ok) >= count else None

    async def _degrade(self, flow: str, reason: str) -> None:
        """Sub-health handling falls back: subHealthyStrategy becomes ``ignore`` (principles 亚健康热切)."""
        await self.c.ports.jobs.update(self.c.job_id, hold=True, sub_healthy_strategy="ignore")
        self.c.decide(flow, "degrade-to-ignore", reason)

    async def _move_ranks(self, mapping: dict[str, str]) -> None:
        """Move every rank on each old node to its new node (hot switch done)."""
        job = self.c.job()
        if job is None:
            return
        ranks = tuple(replace(r, node=mapping.get(r.node, r.node)) for r in job.ranks)
        await self.c.ports.jobs.update(self.c.job_id, ranks=ranks)
