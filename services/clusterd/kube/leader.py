"""Kubernetes mode, only the leader writes (issue 15 HA; ``--kube-leader-elect on``).

With leader election on, several clusterd replicas share the Lease ``--kube-lease-namespace``/
``--kube-lease-name`` (:class:`faultmesh.lease.LeaseElector`). The process runs as a follower
(standby, refusing clients) or as the leader (the full ClusterD on the state kept in the Kubernetes
API): :mod:`clusterd.kube.ha`, :mod:`clusterd.kube.hastate`, :mod:`clusterd.kube.gate`.

Inside a ClusterD, :class:`Leadership` runs the Kubernetes writers — the cluster-info publisher,
the node annotator, the node signals and the rescheduling hand-off — only while the replica holds
the Lease: they start when it is elected (the publisher re-reads what is published, the signals
re-check every node) and are cancelled when it loses the Lease. A graceful stop releases the
Lease so a follower takes over at its next retry (2 s); a crashed leader's Lease expires after
``--kube-lease-s`` (15 s by default, 8 s in the chart).

A ClusterD built in process with ``--kube-leader-elect on`` and no elector of its own (tests)
elects with its own :class:`LeaseElector`; its :class:`clusterd.kube.gate.FollowerGate` refuses
clients while it follows, but it keeps its own SQLite state (no state ConfigMap): the process
entry point (:func:`clusterd.app.main`) always runs :mod:`clusterd.kube.ha` instead.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from clusterd.kube import hahistory
from faultmesh.lease import LeaseElector

Writer = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class LeaderConfig:
    """Leader election's configuration section (:func:`faultmesh.config.section`):
    ``kube_leader_elect`` ``--kube-leader-elect`` (``on``: only the Lease holder writes), the Lease:
    ``kube_lease_namespace`` ``--kube-lease-namespace``, ``kube_lease_name`` ``--kube-lease-name``,
    ``kube_lease_s`` ``--kube-lease-s`` (s); the state ConfigMap that survives a leader loss:
    ``kube_state_name`` ``--kube-state-name``, ``kube_state_max_bytes`` ``--kube-state-max-bytes``,
    ``kube_state_write_s`` ``--kube-state-write-s`` (s); the history mirror
    (:mod:`clusterd.kube.hahistory`): ``kube_history_name`` ``--kube-history-name``,
    ``kube_history_max_events`` ``--kube-history-max-events``, ``kube_history_max_decisions``
    ``--kube-history-max-decisions``, ``kube_history_window_s`` ``--kube-history-window-s`` (s),
    ``kube_history_write_interval_s`` ``--kube-history-write-interval-s`` (s)."""

    kube_leader_elect: str
    kube_lease_namespace: str
    kube_lease_name: str
    kube_lease_s: float
    kube_state_name: str
    kube_state_max_bytes: int
    kube_state_write_s: float
    kube_history_name: str
    kube_history_max_events: int
    kube_history_max_decisions: int
    kube_history_window_s: float
    kube_history_write_interval_s: float


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
    g.add_argument(
        "--kube-state-name",
        default="faultmesh-clusterd-state",
        help="ConfigMap (in the Lease's namespace) holding the state that survives a leader loss",
    )
    g.add_argument(
        "--kube-state-max-bytes",
        type=int,
        default=900_000,
        help="bound of the state document (bytes; a change past it is refused)",
    )
    g.add_argument(
        "--kube-state-write-s",
        type=float,
        default=10.0,
        help="how long a state ConfigMap write is retried before the change is refused (s)",
    )
    hahistory.add_arguments(g)


def identity() -> str:
    """``<hostname>_<random>``, as client-go names candidates."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}"


class Election:
    """This replica's Lease election as the parts that follow it see it (the follower gate, the
    pingmesh fault writer): built first, in :mod:`clusterd.app`, and handed to them, so none holds
    the Kubernetes component. ``elector``: the :class:`LeaseElector`, None while leader election is
    off; given by the replica runner (:mod:`clusterd.kube.ha`), else set once by the Kubernetes
    component when it starts its own (:meth:`own`)."""

    def __init__(self, elector: LeaseElector | None = None) -> None:
        self.elector = elector
        self.owned = False  # True when the Kubernetes component made (runs, releases) the elector

    def own(self, elector: LeaseElector) -> LeaseElector:
        """Set the elector the Kubernetes component made and runs; returns it. Raises
        ``RuntimeError`` when one is set already (the replica runner's, or a second start)."""
        if self.elector is not None:
            raise RuntimeError("the Lease elector is set already")
        self.elector, self.owned = elector, True
        return elector

    def following(self) -> bool:
        """True while leader election is on and this replica does not hold the Lease."""
        return self.elector is not None and not self.elector.leading.is_set()


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
        self._term: list[asyncio.Task] | None = None  # the writers of the current term
        elector.listeners.append(self._changed)

    def add(self, name: str, writer: Writer) -> None:
        """One more writer: from the next term, and at once when this replica leads now."""
        self.writers.append((name, writer))
        if self._term is not None:
            self._term.append(self.spawn(writer(), name=f"kube-leader-{name}"))

    def _changed(self, leading: bool) -> None:
        if not leading:
            self._lost.set()

    async def run(self) -> None:
        """Start the writers on election, cancel them on loss, until cancelled."""
        try:
            while True:
                await self.elector.leading.wait()
                self._lost.clear()
                self.on_elected()
                tasks = self._term = [self.spawn(w(), name=f"kube-leader-{name}") for name, w in self.writers]
                try:
                    await self._lost.wait()
                finally:
                    self._term = None
                    for t in tasks:
                        t.cancel()
                    await asyncio.wait(tasks, timeout=5)
        finally:
            self.elector.listeners.remove(self._changed)
