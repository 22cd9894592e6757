"""Kubernetes mode, node annotation: ``NodeHealthyStatus=UnHealthy`` while a node is UnHealthy
(:meth:`clusterd.nodes.NodeRegistry.health`: faults, agent status, consumed node info), removed when
it recovers. Runs after each publish round in its own task, so a burst of isolated nodes never
delays cluster-info; API errors back off (:class:`faultmesh.retry.Backoff`) and retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from clusterd.kube.metrics import KubeMetrics
from clusterd.nodes import NodeRegistry
from faultmesh.kube import KubeApi, KubeError, run_when_due
from faultmesh.levels import UNHEALTHY
from faultmesh.log import event

log = logging.getLogger("clusterd.kube")

HEALTH_ANNOTATION = "NodeHealthyStatus"
ANNOTATE_CONCURRENCY = 8  # node patches in flight


class NodeAnnotator:
    """See the module docstring. ``known_node(node)``: is it a Kubernetes Node; ``api`` is set by the
    component once connected."""

    def __init__(self, nodes: NodeRegistry, metrics: KubeMetrics, known_node: Callable[[str], bool]) -> None:
        self.nodes = nodes
        self.metrics = metrics
        self.known_node = known_node
        self.api: KubeApi | None = None
        self.due = asyncio.Event()
        self._annotated: dict[str, str] = {}  # node -> annotation value we set

    def forget(self, node: str) -> None:
        """The Node was deleted: nothing of ours is on it any more."""
        self._annotated.pop(node, None)

    async def annotate(self) -> None:
        """NodeHealthyStatus=UnHealthy on UnHealthy nodes, removed on recovery. Raises :class:`KubeError`."""
        unhealthy = self.nodes.unhealthy()
        todo = []
        for node in sorted(unhealthy | set(self._annotated)):
            want = UNHEALTHY if node in unhealthy else None
            if self.known_node(node) and self._annotated.get(node) != want:
                todo.append((node, want))
        sem = asyncio.Semaphore(ANNOTATE_CONCURRENCY)
        results = await asyncio.gather(*(self._annotate_one(node, want, sem) for node, want in todo))
        failed = [e for e in results if e is not None]
        if failed:
            raise failed[0]

    async def _annotate_one(self, node: str, want: str | None, sem: asyncio.Semaphore) -> KubeError | None:
        """Patch one node's annotation; returns the error (None on success or when the node is gone)."""
        assert self.api is not None
        async with sem:
            try:
                await self.api.patch_node(node, {"metadata": {"annotations": {HEALTH_ANNOTATION: want}}})
            except KubeError as e:
                self.metrics.writes.labels("node", "error").inc()
                self.metrics.api_errors.labels(e.op, str(e.status)).inc()
                return None if e.status == 404 else e
        self.metrics.writes.labels("node", "ok").inc()
        event(
            log,
            logging.INFO,
            "node annotated" if want else "node annotation removed",
            node=node,
            annotation=HEALTH_ANNOTATION,
            value=want or "",
        )
        if want:
            self._annotated[node] = want
        else:
            self._annotated.pop(node, None)
        return None

    async def run(self) -> None:
        """Annotate whenever :attr:`due` is set, until cancelled."""
        await run_when_due(self.due, self.annotate, "node annotation failed, retrying")
