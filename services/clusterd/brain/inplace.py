"""Recover-in-place: which fault pods restart only their processes and which restart the pod
(clusterd.md §6.2 "recover-in-place", §7.3 step 3; the reference's waitNormalFaultRecovery,
splitRecoverInPlacePodInfoToRestartProcessOrRestartPodList and handleRestartFaultProcess).

Before ``globalFault`` of a job with ``recover-in-place`` configured, each fault pod whose cached
faults all have an in-place level (RestartRequest / RestartBusiness / NotHandleFault) is a
candidate; several pods with only software faults (ReportProcessFault ranks) are none. The
controller then waits up to ``in_place_wait_s`` (15 s = 5 x 3 s) for the candidates' hardware
faults to vanish: a pod whose faults vanished restarts its processes (``fault_nodes_restart`` to
it later), every other fault pod is told to exit (``globalFault`` ``fault_nodes_exit`` with
nodeRankIds = those pods, faultRanks = each of them expanded to all its ranks plus the restarting
pods' own fault ranks). When another strategy than recover-in-place is chosen, every fault pod
restarts as a pod (``changeStrategy`` with ``fault_nodes_exit``).
"""

from __future__ import annotations

import asyncio
import time

from clusterd.brain import states
from clusterd.brain import strategy as strat
from clusterd.brain.ctlcore import ControllerCore
from faultmesh.levels import UNHEALTHY, level_health


class InPlaceSteps:
    """The recover-in-place steps of the recovery flow (module docstring); ``c`` the controller core."""

    def __init__(self, c: ControllerCore) -> None:
        self.c = c
        self.st = c.st

    def in_place_candidates(self) -> set[int]:
        """Pod ranks whose cached faults all have an in-place level (module docstring)."""
        by_pod: dict[int, list] = {}
        for f in self.st.cached_faults.values():
            by_pod.setdefault(f.pod_rank, []).append(f)
        pods = {p for p, fs in by_pod.items() if p >= 0 and all(f.level in strat.IN_PLACE_LEVELS for f in fs)}
        software_only = all(not f.code for f in self.st.cached_faults.values())
        if software_only and len(by_pod) > 1:
            return set()  # the reference: several pods with only software faults cannot restart in place
        return pods

    def _pods_with_faults(self, pods: set[int]) -> set[int]:
        job = self.c.job()
        if job is None:
            return set()
        return {
            f.pod_rank
            for f in self.c.ports.rank_faults(job)
            if f.pod_rank in pods and level_health(f.level) == UNHEALTHY
        }

    async def split_in_place(self, flow: str, configured: list[str]) -> None:
        """Set ``restart_proc_pods`` (module docstring); records an ``in-place-split`` decision."""
        self.st.restart_proc_pods = set()
        if "recover-in-place" not in configured:
            return
        candidates = self.in_place_candidates()
        if not candidates:
            return
        self.c.set_state(states.WAIT_FAULT_DISAPPEAR)
        deadline = time.monotonic() + self.c.t.in_place_wait_s
        left = self._pods_with_faults(candidates)
        while left and time.monotonic() < deadline:
            await asyncio.sleep(min(self.c.t.poll_s, max(0.0, deadline - time.monotonic())))
            left = self._pods_with_faults(candidates)
        self.st.restart_proc_pods = candidates - left
        exit_pods = sorted(
            {f.pod_rank for f in self.st.cached_faults.values() if f.pod_rank >= 0}
            - self.st.restart_proc_pods
        )
        self.c.decide(
            flow, "in-place-split",
            f"restart processes on pods {sorted(self.st.restart_proc_pods)}, restart pods {exit_pods}"
            + (f" (faults still present after {self.c.t.in_place_wait_s}s)" if left else ""),
            faults=self.st.faults(), restart_process_pods=sorted(self.st.restart_proc_pods), restart_pods=exit_pods,
        )  # fmt: skip

    def in_place_actions(self, strategy: str) -> list[str]:
        """``changeStrategy`` actions: in-place -> fault_nodes_restart; another strategy (not retry)
        after in-place was possible -> fault_nodes_exit (every fault pod restarts as a pod)."""
        if strategy == "recover-in-place":
            return ["change_strategy", "fault_nodes_restart"]
        if self.st.in_place_dropped and strategy != "retry":
            return ["change_strategy", "fault_nodes_exit"]
        return ["change_strategy"]

    def drop_in_place(self) -> None:
        """Another strategy than recover-in-place: every fault pod restarts as a pod."""
        if self.st.restart_proc_pods:
            self.st.restart_proc_pods = set()
            self.st.in_place_dropped = True
