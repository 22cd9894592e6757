"""Kubernetes mode, only the leader writes (issue 15 HA, first part; ``--kube-leader-elect on``).

With leader election on, several clusterd replicas watch the same objects, but only the holder of
the Lease ``--kube-lease-namespace``/``--kube-lease-name`` (:class:`faultmesh.lease.LeaseElector`)
runs the Kubernetes writers: the cluster-info publisher, the node annotator, the node signals and
the rescheduling hand-off. They start when this replica is elected (the publisher re-reads what is
published, the signals re-check every node) and are cancelled when it loses the Lease; a graceful
stop releases the Lease so a follower takes over at its next retry (2 s), a crashed leader's Lease
expires after ``--kube-lease-s`` (15 s).

Not yet (issue 15): followers still serve the agent stream and the gRPC services (route clients
to the leader with a readiness gate), and the state that must survive a leader loss stays in each
replica's SQLite file.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from faultmesh.lease import LeaseElector

Writer = Callable[[], Coroutine[Any, Any, None]]


def add_arguments(g) -> None:
    """The leader-election flags (on clusterd's Kubernetes argument group ``g``)."""
    g.add_argument(
        "--kube-leader-elect", choices=("on", "off"), default="off", help="only the Lease holder writes"
    )
    g.add_argument(
        "--kube-lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "mindx-dl"),
        help="namespace of the leader Lease (env POD_NAMESPACE)",
    )
    g.add_argument("--kube-lease-name", default="faultmesh-clusterd", help="name of the leader Lease")
    g.add_argument("--kube-lease-s", type=float, default=15.0, help="Lease duration (s)")


def identity() -> str:
    """``<hostname>_<random>``, as client-go names candidates."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}"


class Leadership:
    """Runs ``writers`` (coroutine factories) while ``elector`` leads; ``on_elected()`` first."""

    def __init__(
        self,
        elector: LeaseElector,
        writers: list[tuple[str, Writer]],
        spawn: Callable[..., asyncio.Task],
        on_elected: Callable[[], None],
    ) -> None:
        self.elector = elector
        self.writers = writers
        self.spawn = spawn
        self.on_elected = on_elected
        self._lost = asyncio.Event()
        elector.on_change = self._changed

    def _changed(self, leading: bool) -> None:
        if not leading:
            self._lost.set()

    async def run(self) -> None:
        """Start the writers on election, cancel them on loss, until cancelled."""
        while True:
            await self.elector.leading.wait()
            self._lost.clear()
            self.on_elected()
            tasks = [self.spawn(w(), name=f"kube-leader-{name}") for name, w in self.writers]
            try:
                await self._lost.wait()
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.wait(tasks, timeout=5)
