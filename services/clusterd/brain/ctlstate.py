"""The per-job recovery controller's state, in one dataclass, and its timeouts (clusterd.md §7).

:class:`ControllerState` is everything the controller knows between two steps: the reference's
state name, the running flow, its uuid, the cached faults (the reset ConfigMap's fault list), the
in-place split, the platform's strategy, the O&M kind, the last signals. One object holds it; the
flows (:mod:`clusterd.brain.flows` and the step modules) read and write it through the controller
core (:mod:`clusterd.brain.ctlcore`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace

from clusterd.brain import states
from clusterd.brain.faultview import RankFault
from clusterd.brain.states import INIT

log = logging.getLogger("clusterd.brain")

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
    command_gap_s: float = 1.0  # TaskD's manager reads its latest ClusterD command once a second
    hot_switch_wait_s: float = 60.0  # backup pod running
    scale_wait_s: float = 270.0  # elastic training: resources back
    kill_s: float = 60.0  # killMaster enqueue
    fault_retry_s: float = 65.0  # FaultRetry: the job Running again after dump_exit (13 x 5 s)
    hccl_route_s: float = 3.0  # a retry with HCCL ranks waits for route convergence
    poll_s: float = 1.0
    subscriber_wait_s: float = 10.0  # an O&M notify stream (SubscribeNotifySwitch / ExecStressTest)
    in_place_wait_s: float = 15.0  # recover-in-place: the pods' faults must vanish (5 x 3 s)
    platform_s: float = 300.0  # platform mode: each wait for the AI platform (ProcessControlTimeout)
    pre_exit_wait_s: float = 10.0  # preExitProcess waits while INIT (sleepForStateChange, 10 x 1 s)
    job_wait_scale: float = 1.0  # x the job's own waits (wait-reschedule-timeout, MINDIO_WAIT_MINDX_TIME)


class FlowEnd(Exception):
    """Raised inside a flow to end it (the controller returns to INIT)."""


@dataclass
class ControllerState:
    """One job's controller state (module docstring). ``clear_flow`` empties what a flow owns."""

    job_id: str
    state: str = INIT  # the reference's state name (:mod:`clusterd.brain.states`); set with set_state
    flow_name: str = ""  # "recovery" | "switch-nic" | "stress-test" | "hot-switch" while a flow runs
    uuid: str = ""  # the flow's signal uuid ("" between flows)
    cached_faults: dict[tuple[int, str], RankFault] = field(default_factory=dict)  # (rank, code) ->
    seen_fault_keys: set[tuple[int, str]] = field(default_factory=set)  # the intake's last look
    hidden_nodes: set[str] = field(default_factory=set)  # nodes under stress test (80818C05/06 hidden)
    agent_strategies: list[str] = field(default_factory=list)  # the last ReportRecoverStrategy's
    sent: list[tuple[str, list[str]]] = field(default_factory=list)  # last signals (type, actions)
    no_status: str = ""  # why the last strategy got no status (not sent / timed out)
    restart_proc_pods: set[int] = field(default_factory=set)  # recover-in-place: pods restarting processes
    in_place_dropped: bool = False  # in-place was possible, another strategy restarts every pod
    plat_strategy: str = ""  # platform mode: the AI platform's ProcessRecoverStrategy
    om_kind: str = ""  # "nic" | "stress" while an O&M flow runs
    resched_started: float = 0.0  # monotonic time WaitReportRecoverStrategy began (the watcher's start)
    fault_pod_uids: dict[int, str] = field(default_factory=dict)  # Kubernetes: pod rank -> UID then

    def set_state(self, state: str) -> bool:
        """Move to ``state``: every state change of the controller goes through here. The move is
        judged against the state table (:func:`clusterd.brain.states.check`): an illegal one is
        logged (``controller illegal transition``) and counted, and still made. Returns whether it
        was legal."""
        ok = states.check(self.job_id, self.state, state)
        if state != self.state:
            log.debug("job=%s state %s -> %s", self.job_id, self.state, state)
        self.state = state
        return ok

    def clear_flow(self) -> None:
        """Forget what the flow owned (the reference's reset after every flow); the state stays."""
        self.hidden_nodes.clear()
        self.cached_faults.clear()
        self.restart_proc_pods, self.in_place_dropped = set(), False
        self.plat_strategy = ""
        self.uuid = ""
        self.om_kind = ""
        self.fault_pod_uids = {}

    # -- the cached faults (the reset ConfigMap's fault list) -------------------------------------
    def add_faults(self, faults: list[RankFault], new_ranks_only: bool = False) -> None:
        """Merge rank faults into the cached faults. ``new_ranks_only``: skip ranks already cached
        (a ReportProcessFault rank the hardware intake already holds)."""
        ranks = {k[0] for k in self.cached_faults} if new_ranks_only else set()
        for f in faults:
            if f.rank not in ranks:
                self.cached_faults[(f.rank, f.code)] = f

    def faults(self) -> list[RankFault]:
        """The cached faults, by rank then code."""
        return [self.cached_faults[k] for k in sorted(self.cached_faults)]

    def expand_to_pods(self, job, keep: set[int] | frozenset[int] = frozenset()) -> list[RankFault]:
        """Make every cached fault normal ("1") and add every other rank of each fault pod of ``job``
        (None: none added; the reference's GetFaultRankIdsInSameNode, §7.3 step 3): the pods told to
        exit lose all their ranks, so MindIO must hear of all of them. Pods in ``keep`` (pod ranks
        restarting their processes in place) keep only their own fault ranks. Returns the cached faults."""
        for k, f in list(self.cached_faults.items()):
            self.cached_faults[k] = normal(f)
        if job is not None:
            have = {k[0] for k in self.cached_faults}
            by_node = {f.node: f for f in self.cached_faults.values() if f.pod_rank not in keep}
            for node, f in by_node.items():
                for r in job.ranks_on(node):
                    if r.rank not in have:
                        self.cached_faults[(r.rank, "")] = replace(
                            f, rank=r.rank, device_id=r.device_id, code=""
                        )
        return self.faults()


def normal(f: RankFault) -> RankFault:
    """``f`` as a normal fault (faultType "1")."""
    return replace(f, fault_type="1")


def pod_ranks(faults) -> list[str]:
    """The pod ranks (``nodeRankIds``) hosting ``faults``, as sorted strings (the reference's
    GetNodeRankIdsByFaultRanks)."""
    return sorted({str(f.pod_rank) for f in faults if f.pod_rank >= 0}, key=int)
