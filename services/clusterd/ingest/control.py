"""Control messages ClusterD sent an agent and the agent has not acked yet (the ClusterD side of the
agent stream, :mod:`clusterd.ingest.agents`).

An agent acks each control message (``ControlMessage.seq`` > 0) once its handler returned, in
order. A stream can die without ClusterD noticing: when an agent's grpcio call fails on the agent's
side (INTERNAL "Internal error from Core"), grpcio never cancels it, so its HTTP/2 stream stays open
and ClusterD learns of it only when the agent's next stream takes the old one over, seconds later;
whatever was queued on the old stream meanwhile was lost. So each session keeps its control messages
(:class:`~clusterd.ingest.session.ControlLog`) until the agent acks them, and the hub re-queues the
unacked ones, in order and before anything new, on the (node, agent)'s next session: at a takeover,
the old session's; after a stream end that ClusterD noticed, what that session left
(:class:`LeftControl`). Every agent-side handler is idempotent (it sets state: a job's ranks, a
switch, a ping list, ...), so a message the agent applied but whose ack was lost is harmless.

Both are bounded: a session keeps at most ``MAX_KEPT`` messages / ``MAX_KEPT_BYTES`` bytes
(:mod:`clusterd.ingest.session`; the oldest go first), and what ended sessions left at most
:data:`MAX_LEFT_BYTES` in all (the sessions that ended first lose theirs first), for as long as
ClusterD remembers the agent (``--agent-expire-after-s``, a day: an expired agent starts afresh and
its components' ``on_connect`` pushes give it the state of now). Each message dropped is counted in
``faultmesh_agent_control_dropped_total{reason}`` (``kept_full`` / ``left_full`` / ``left_expired``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from clusterd.ingest.session import MAX_QUEUED, AgentSession, ControlLog
from faultmesh._pb import agent_pb2
from faultmesh.log import event

log = logging.getLogger("clusterd.agents")

MAX_LEFT_BYTES = 16 << 20  # unacked control messages ended sessions left for their next one, in all


def dropped_counter(registry: CollectorRegistry) -> Counter:
    """``faultmesh_agent_control_dropped_total{reason}``: control messages that will not be re-queued."""
    return Counter(
        "faultmesh_agent_control_dropped_total",
        "Unacked control messages dropped from what a reconnecting agent gets again (bound reached)",
        ["reason"],
        registry=registry,
    )


class LeftControl:
    """What ended sessions left unacked, per (node, agent), until that agent's next session takes
    it (:meth:`take`), at most ``max_age_s`` seconds. At most ``max_bytes`` in all: past it the
    sessions that ended first lose theirs. ``dropped``: the dropped-messages counter (reasons
    ``left_full``, ``left_expired``)."""

    def __init__(
        self,
        dropped: Counter | None = None,
        max_bytes: int = MAX_LEFT_BYTES,
        max_age_s: float = 86400.0,
    ) -> None:
        self._left: OrderedDict[tuple[str, str], tuple[float, ControlLog]] = OrderedDict()
        self.bytes = 0
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.dropped = dropped

    def __len__(self) -> int:
        return len(self._left)

    def put(self, key: tuple[str, str], log: ControlLog) -> None:
        """Hold ``log`` (an ended session's) for ``key``'s next session."""
        self._drop(key, "left_full")  # a session ends at most once: nothing is there in practice
        if not len(log):
            return
        self._left[key] = (time.monotonic(), log)
        self.bytes += log.bytes
        while self.bytes > self.max_bytes and self._left:
            self._drop(next(iter(self._left)), "left_full")

    def take(self, key: tuple[str, str]) -> list[agent_pb2.ControlMessage]:
        """What the last ended session of ``key`` left unacked (oldest first), and forget it; [] when
        it ended more than ``max_age_s`` ago (those are dropped)."""
        entry = self._left.get(key)
        if entry is None:
            return []
        if time.monotonic() - entry[0] > self.max_age_s:
            self._drop(key, "left_expired")
            return []
        del self._left[key]
        self.bytes -= entry[1].bytes
        return entry[1].unacked()

    def _drop(self, key: tuple[str, str], reason: str) -> None:
        entry = self._left.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry[1].bytes
        if self.dropped is not None:
            self.dropped.labels(reason).inc(len(entry[1]))


class ControlSender:
    """The control half of :class:`~clusterd.ingest.agents.AgentHub`: numbers and queues control
    messages on the live session of a (node, agent) (``sessions``: the hub's own table, read here),
    keeps each until acked and re-queues the unacked ones on the next session (module docstring).
    ``reject(reason, **fields)`` counts and logs a refused message; metrics go to ``registry``;
    ``left_for_s``: how long an ended session's unacked messages wait for the next (s: the hub's
    agent expiry)."""

    def __init__(
        self,
        sessions: dict[tuple[str, str], AgentSession],
        registry: CollectorRegistry,
        reject: Callable[..., None],
        left_for_s: float = 86400.0,
    ) -> None:
        self.sessions = sessions
        self._reject = reject
        self.dropped = dropped_counter(registry)
        self.left = LeftControl(self.dropped, max_age_s=left_for_s)
        self.requeued = Counter(
            "faultmesh_agent_control_requeued_total",
            "Unacked control messages of an old agent session queued again on its next session",
            registry=registry,
        )

    def new_log(self) -> ControlLog:
        """The :class:`ControlLog` of a new session."""
        return ControlLog(dropped=self.dropped)

    async def send(self, node: str, agent: str, **body: Any) -> bool:
        """Queue one control message (``ping_list=PingList(...)``, ...) to (node, agent), kept
        until the agent acks it. False when that agent has no live session or its queue is full."""
        s = self.sessions.get((node, agent))
        if s is None or s.closed:
            return False
        return self._number_and_queue(s, agent_pb2.ControlMessage(**body))

    def _number_and_queue(self, s: AgentSession, msg: agent_pb2.ControlMessage) -> bool:
        if not self.queue(s, msg):
            return False
        s.control_seq += 1
        msg.seq = s.control_seq
        s.control.keep(msg)
        return True

    def queue(self, s: AgentSession, msg: agent_pb2.ControlMessage) -> bool:
        """Put ``msg`` on ``s``'s writer queue; False (rejected ``control_queue_full``) when full."""
        if s.queue.qsize() >= MAX_QUEUED:
            self._reject("control_queue_full", node=s.node, agent=s.agent)
            return False
        s.queue.put_nowait(msg)
        return True

    def acked(self, s: AgentSession, seq: int) -> None:
        """The agent of ``s`` acked control messages up to ``seq``."""
        s.acked_control = max(s.acked_control, seq)
        s.control.ack(seq)

    def carry_over(self, new: AgentSession, old: AgentSession | None, why: str) -> int:
        """Queue on ``new`` (nothing queued on it yet) what the (node, agent)'s previous session did
        not get acked: ``old``'s (taken over, ``why`` ``reconnect``/``restart``) or, without one,
        what an ended one left (``why`` ``ended``). Renumbered in ``new``'s sequence, in order.
        Logged "control messages re-queued" with the count; returns it."""
        msgs = old.control.unacked() if old is not None else self.left.take((new.node, new.agent))
        n = 0
        for old_msg in msgs:  # a copy: the old stream's writer may hold the original
            m = agent_pb2.ControlMessage()
            m.CopyFrom(old_msg)
            if self._number_and_queue(new, m):
                n += 1
        if n:
            self.requeued.inc(n)
            event(log, logging.INFO, "control messages re-queued", node=new.node, agent=new.agent,
                  count=n, after=why)  # fmt: skip
        return n

    def ended(self, s: AgentSession) -> None:
        """``s`` ended and no newer session took it over: hold what it left unacked for the next."""
        self.left.put((s.node, s.agent), s.control)
