"""Elastic training: DP scale-in, then scale-out when the fault ranks are healthy again (clusterd.md
§7.3 "elastic training"; the reference's handleCheckScaleStrategyRecoverResult and
ScaleInRunning).

After ``changeStrategy downgrade`` the training side answers 201 with the ranks MindIO isolates
besides the fault ranks: their pods exit (``faultNodesExit``, the pods that exited at the
globalFault left out), then a status 0 means the job trains on fewer DP groups (ScaleInRunning).
Until the resources are back (up to ``scale_wait_s``) the job keeps running scaled in; then
``changeStrategy upgrade`` scales it out again. Back means, in Kubernetes mode, the PodGroup Running
and the fault pods replaced (the reference's scale-out; issue 32 item 4), standalone (or a job
without a PodGroup) no fault rank UnHealthy any more. A new fault during ScaleInRunning
restarts the recovery (NotifyStopTrain), which the recovery flow runs (:data:`NEW_FAULT`).
"""

from __future__ import annotations

import asyncio
import time

from clusterd.brain import states
from clusterd.brain.ctlcore import ControllerCore
from clusterd.brain.ctlstate import pod_ranks
from clusterd.brain.reschedule import RescheduleSteps

NEW_FAULT = "new-fault"  # :meth:`ElasticSteps.run`: a new fault came during ScaleInRunning


class ElasticSteps:
    """The elastic-training steps of the recovery flow (module docstring); ``c`` the controller core."""

    def __init__(self, c: ControllerCore, resched: RescheduleSteps) -> None:
        self.c = c
        self.st = c.st
        self.resched = resched

    def _back(self) -> bool:
        """The scaled-in fault ranks' resources are back: Kubernetes mode, the PodGroup Running and
        the fault pods replaced (:meth:`RescheduleSteps.pods_replaced`); standalone, no fault rank
        UnHealthy any more."""
        pods = {f.pod_rank for f in self.st.cached_faults.values() if f.pod_rank >= 0}
        kube = self.resched.pods_replaced(pods)
        if kube is not None:
            return kube
        return not self.resched.current_faults(self.st.cached_faults)

    async def run(self, flow: str, rep) -> tuple[bool, int | None] | str:
        """Scale in after the downgrade's status ``rep``, then scale out. Returns (success, status code
        or None when no status came), or :data:`NEW_FAULT` (the caller restarts the recovery)."""
        c, io = self.c, self.c.io
        if rep.status.code == 201:
            isolate = []
            job = c.job()
            for rid in rep.isolateRankIds:
                node = job.node_of_rank(int(rid)) if job and rid.isdigit() else None
                if node is not None:
                    isolate.append(str(job.pod_rank(node)))
            # handleCheckScaleStrategyRecoverResult -> RemoveDuplicateNodeRanks: the fault pods
            # exited at the globalFault already; only the pods MindIO isolates besides them exit now
            exited = set(pod_ranks(self.st.faults()))
            io.expect("status")
            await io.signal(
                "faultNodesExit", ["fault_nodes_exit"], node_rank_ids=sorted(set(isolate) - exited, key=int)
            )
            r = await io.wait("status")
            if r is None:
                return False, None
            rep = r[1]
        if rep.status.code != 0:
            return False, rep.status.code
        c.set_state(states.SCALE_IN_RUNNING)
        c.decide(flow, "scale-in-success", "training continues on fewer DP groups")
        scaled = {k[0] for k in self.st.cached_faults}
        deadline = time.monotonic() + c.t.scale_wait_s
        while time.monotonic() < deadline:
            if {k[0] for k in self.st.cached_faults} - scaled:
                # §7.3 elastic step 4: a new fault during ScaleInRunning -> NotifyStopTrain
                c.decide(flow, "stop-train", "new fault during ScaleInRunning", faults=self.st.faults())
                return NEW_FAULT
            if self._back():
                break
            await asyncio.sleep(c.t.poll_s)
        else:
            c.decide(flow, "scale-in-kept", f"fault ranks not healthy within {c.t.scale_wait_s}s")
            return True, 0
        io.expect("status")
        faults = self.st.faults()  # the cached faults, nodeRankIds their pods
        await io.signal(
            "changeStrategy", ["change_strategy"], faults, change_strategy="upgrade",
            extra='{"scale-out-strategy": "DP"}', node_rank_ids=pod_ranks(faults),
        )  # fmt: skip
        r = await io.wait("status")
        if r is None or r[1].status.code != 0:
            return False, None if r is None else r[1].status.code
        c.decide(flow, "scale-out-success", "resources back")
        self.st.cached_faults.clear()
        return True, 0
