"""Agent liveness and expiry on the ClusterD side of the agent stream (issue 20): the part of
:class:`clusterd.ingest.agents.AgentHub` that runs on a clock, not on a message (the hub holds one
:class:`Liveness` as ``liveness``, over its own session table).

A stream silent for ``stale_after_s`` is marked stale in the node registry (faults kept); an agent
without a stream for ``expire_after_s`` is dropped with its faults, and the node with its last agent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter

from faultmesh.log import event

if TYPE_CHECKING:
    from clusterd.center import FaultCenter
    from clusterd.ingest.session import AgentSession
    from clusterd.nodes import NodeRegistry

log = logging.getLogger("clusterd.agents")


class Liveness:
    """The stale marks and the expiry of the agents of ``sessions`` ((node, agent) -> its live
    stream: the :class:`~clusterd.ingest.agents.AgentHub`'s own table, read here, never written).
    ``stale_after_s`` and ``expire_after_s`` are seconds; ``expired`` counts the dropped agents
    (``faultmesh_agents_expired_total`` in ``registry``). ``on_stale(session)`` runs when a stream
    is marked stale (the hub drops the snapshot parts it held: a hung agent holds no memory)."""

    def __init__(
        self,
        center: FaultCenter,
        nodes: NodeRegistry,
        sessions: dict[tuple[str, str], AgentSession],
        registry: CollectorRegistry,
        stale_after_s: float = 30.0,
        expire_after_s: float = 86400.0,
        on_stale: Callable[[AgentSession], None] = lambda s: None,
    ) -> None:
        self.center = center
        self.on_stale = on_stale
        self.nodes = nodes
        self.sessions = sessions
        self.stale_after_s = stale_after_s
        self.expire_after_s = expire_after_s
        self.expired = Counter(
            "faultmesh_agents_expired_total",
            "Agents of a node dropped after --agent-expire-after-s without a stream (with their faults)",
            registry=registry,
        )

    async def watch(self) -> None:
        """Mark a connected agent stale when nothing (not even its heartbeat) arrived for
        ``stale_after_s``; its faults stay, the node view and ``faultmesh_agent_stale`` say so.
        Checks 10 times per deadline (at most once per second); also drops the agents gone for
        ``expire_after_s`` (:meth:`expire`, 10 times per expiry time, at most once a minute).
        Runs until cancelled."""
        period = max(0.05, min(1.0, self.stale_after_s / 10))
        expire_every = max(0.05, min(60.0, self.expire_after_s / 10))
        next_expiry = time.monotonic() + expire_every
        while True:
            await asyncio.sleep(min(period, expire_every))
            if time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + expire_every
                await self.expire()
            now = time.time()
            for s in list(self.sessions.values()):
                if not s.stale and not s.closed and now - s.last_seen > self.stale_after_s:
                    s.stale = True
                    self.nodes.set_stale(s.node, s.agent, "NoHeartbeat", int(s.last_seen * 1000))
                    event(
                        log,
                        logging.WARNING,
                        "agent stale",
                        node=s.node,
                        agent=s.agent,
                        silent_s=round(now - s.last_seen, 1),
                    )
                    self.on_stale(s)

    async def expire(self) -> int:
        """Drop every agent with no stream for more than ``expire_after_s`` (clock: its last Hello or
        stream end, never before this ClusterD started): its faults on that node
        (:meth:`FaultCenter.replace_origin` with nothing), its stale and pending marks, and with the
        node's last agent the node entry itself, so the node leaves ``/v1/nodes``, the web view and
        the per-node metrics. As in the reference when a node's ConfigMap goes away, a vanished node
        takes its faults with it; faults of other origins (public faults) stay. A reconnect is a
        fresh start: Hello and snapshot rebuild the entry. A failed state write is retried on the
        next round. Logged "agent expired", counted in ``faultmesh_agents_expired_total``.
        Returns how many agents were dropped."""
        n = 0
        for node, agent in self.nodes.expired_agents(self.expire_after_s, self.sessions):
            try:
                changes = await self.center.replace_origin(node, agent, [])
            except Exception as e:  # state write failed: keep everything, try again next round
                event(log, logging.ERROR, "agent expiry failed", node=node, agent=agent, error=repr(e))
                continue
            if (node, agent) in self.sessions:  # it came back meanwhile: its snapshot rules
                continue
            dropped = self.nodes.forget_agent(node, agent)
            self.expired.inc()
            n += 1
            event(
                log,
                logging.WARNING,
                "agent expired",
                node=node,
                agent=agent,
                faults_dropped=len(changes),
                node_dropped=dropped,
                after_s=self.expire_after_s,
            )
        return n
