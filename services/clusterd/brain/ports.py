"""What a recovery controller uses of the rest of ClusterD (issue 28: no controller holds the brain).

:class:`ControllerPorts` is built once by :class:`clusterd.brain.component.BrainComponent` from the
narrow parts it owns and handed to every :class:`clusterd.brain.controller.Controller`. Each field is
one port; nothing else of the brain is reachable from a controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from clusterd.brain.faultview import RankFault
from clusterd.brain.jobs import Job, JobRegistry
from faultmesh.model import Fault


class DecisionSink(Protocol):
    """Records one recovery decision (:meth:`clusterd.brain.decisions.DecisionLog.record` with the
    controller's state added). Returns the record. Never waits."""

    def __call__(
        self, job_id: str, flow: str, decision: str, reason: str, faults: Any = None, **extra: Any
    ) -> dict: ...


class PlatformPort(Protocol):
    """The job's platform-mode annotations (:class:`clusterd.brain.platform.PlatformAnnotations`)."""

    def get(self, job_id: str) -> dict[str, str]: ...

    async def patch(self, job_id: str, changes: dict[str, str | None]) -> bool: ...


class PodsPort(Protocol):
    """The job's pods and PodGroup in Kubernetes mode (:class:`clusterd.kube.podport.KubePods`;
    issue 32 items 3-4). Standalone ClusterD has none (``ControllerPorts.pods`` is None)."""

    def pod_uids(self, job_id: str) -> dict[int, str]: ...

    def resources_back(self, job_id: str, old_uids: dict[int, str]) -> bool | None: ...

    async def request_backup(self, job_id: str, node: str, timeout_s: float) -> str | None: ...

    async def delete_old_pod(self, job_id: str, timeout_s: float) -> bool: ...

    def switching(self, job_id: str) -> bool: ...

    async def end_switch(self, job_id: str, ok: bool, cancelled: bool = False) -> None: ...


@dataclass(frozen=True)
class ControllerPorts:
    """The controller's outside, one port per field.

    - ``jobs``: the job registry (read a job; ``update`` its process-recover-enable, sub-health
      strategy or ranks);
    - ``decide``: the decision sink (:class:`DecisionSink`);
    - ``rank_faults(job)``: the job's rank faults now, every filter applied (stress-test hidden
      codes, retry and custom filters);
    - ``faults_of_node(node)``: the fault center's active faults of a node (a backup's health);
    - ``isolate_nodes(job_id, nodes)``: mark nodes UnHealthy in the fault center (stress test code 2);
    - ``platform``: platform mode's annotations (:class:`PlatformPort`);
    - ``spawn(coro, name)``: run a task owned by ClusterD (cancelled on shutdown);
    - ``count_rejected(reason)``: a dropped report (faultmesh_rejected_requests_total);
    - ``count_signal(signal_type)``: a delivered ProcessManageSignal (faultmesh_brain_signals_total);
    - ``pods``: Kubernetes mode's pods and PodGroup (:class:`PodsPort`: the hot switch's backup pod
      from the Operator, "resources back" by the PodGroup); None standalone.
    """

    jobs: JobRegistry
    decide: DecisionSink
    rank_faults: Callable[[Job], list[RankFault]]
    faults_of_node: Callable[[str], Iterable[Fault]]
    isolate_nodes: Callable[[str, list[str]], Awaitable[None]]
    platform: PlatformPort
    spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task]
    count_rejected: Callable[[str], None]
    count_signal: Callable[[str], None]
    pods: PodsPort | None = None
