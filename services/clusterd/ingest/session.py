"""One agent stream's state on the ClusterD side (:mod:`clusterd.ingest.agents`): the session of a
connected agent, the messages its writer sends in order and the control messages it keeps until
its agent acks them (:class:`ControlLog`, re-queued by :mod:`clusterd.ingest.control`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from faultmesh._pb import agent_pb2
from faultmesh.log import event

log = logging.getLogger("clusterd.agents")

MAX_QUEUED = 1024  # control messages and error acks waiting for one stream's writer
MAX_KEPT = 512  # control messages one session keeps until its agent acks them
MAX_KEPT_BYTES = 1 << 20  # ... and their encoded size
MAX_IN_FLIGHT = 64  # messages of one stream handed to the fault center and not yet acked
END = object()  # queued when a stream's reader ends


@dataclass(slots=True)
class Pending:
    """A valid Snapshot / Delta / digest claim handed to the fault center: acked once ``fut`` (None:
    no fault to store; a claim's: the held mark) is durable, then its node state and callbacks are
    applied, in stream order."""

    kind: str  # "snapshot" | "delta" | "claim"
    body: Any  # agent_pb2.Snapshot | agent_pb2.Delta
    fut: asyncio.Future | None
    refused: int = 0
    pending: frozenset[str] = frozenset()
    views: Any = None  # a snapshot's (conditions, devices) node-registry views


def retrieve(fut: asyncio.Future) -> None:
    """Done callback of a future nobody awaits any more: mark its exception retrieved."""
    if not fut.cancelled():
        fut.exception()


class ControlLog:
    """The control messages of one agent session, in seq order, until the agent acks them.

    ``max_count`` / ``max_bytes``: the bound (messages / encoded bytes); past it the oldest are
    dropped and counted in ``dropped`` (the dropped-messages counter, reason ``kept_full``)."""

    __slots__ = ("_kept", "bytes", "max_count", "max_bytes", "dropped")

    def __init__(
        self, max_count: int = MAX_KEPT, max_bytes: int = MAX_KEPT_BYTES, dropped: Counter | None = None
    ) -> None:
        self._kept: deque[tuple[agent_pb2.ControlMessage, int]] = deque()
        self.bytes = 0
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.dropped = dropped

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, msg: agent_pb2.ControlMessage) -> int:
        """Keep ``msg`` (its ``seq`` larger than any kept). Returns how many old ones it pushed out."""
        size = msg.ByteSize()
        self._kept.append((msg, size))
        self.bytes += size
        n = 0
        while len(self._kept) > 1 and (len(self._kept) > self.max_count or self.bytes > self.max_bytes):
            _, old = self._kept.popleft()
            self.bytes -= old
            n += 1
        if n and self.dropped is not None:
            self.dropped.labels("kept_full").inc(n)
        return n

    def ack(self, seq: int) -> None:
        """The agent acked every control message up to ``seq``: forget them."""
        kept = self._kept
        while kept and kept[0][0].seq <= seq:
            self.bytes -= kept.popleft()[1]

    def unacked(self) -> list[agent_pb2.ControlMessage]:
        """The messages not acked yet, oldest first."""
        return [m for m, _ in self._kept]


@dataclass
class AgentSession:
    """One connected agent: its identity, stream queue and latest non-fault state."""

    node: str
    agent: str
    boot_id: str
    node_ip: str
    node_sn: str
    peer: str
    # what the stream's writer sends, in order: acks (Pending: once durable), control messages,
    # None (taken over: end now) and END (the reader ended: end after what is queued before it)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    in_flight: int = 0  # messages queued as Pending, not yet settled by the writer
    room: asyncio.Event = field(default_factory=asyncio.Event)  # set when in_flight drops below the max
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    last_seq: int = 0
    # condition types and (device_type, device_id) keys this stream's accepted messages add to its
    # node since its last complete snapshot: counted against the limits before they are applied
    sent: tuple[set, set] = field(default_factory=lambda: (set(), set()))
    control_seq: int = 0  # the last control message's seq (this session numbers its own from 1)
    acked_control: int = 0  # the highest seq the agent acked
    control: ControlLog = field(default_factory=ControlLog)  # sent, not acked yet
    closed: bool = False
    stale: bool = False  # nothing arrived for the hub's stale_after_s (a hung agent)
    parts: Any = None  # the snapshot parts collected so far (clusterd.ingest.parts.Collection)

    def note_sent(self, body, replace: bool) -> None:
        """Count the conditions and devices of an accepted Snapshot/Delta ``body`` in :attr:`sent`;
        ``replace``: a complete snapshot (it becomes the whole set)."""
        if replace:
            self.sent[0].clear()
            self.sent[1].clear()
        self.sent[0].update(c.type for c in body.conditions)
        self.sent[1].update((d.device_type, d.device_id) for d in body.devices)


def takeover_reason(old: AgentSession, new: AgentSession) -> str:
    """``reconnect`` when ``new`` comes from the same agent process as ``old`` (boot id), else ``restart``."""
    return "reconnect" if old.boot_id == new.boot_id else "restart"


def take_over(old: AgentSession, new: AgentSession, takeovers: Counter) -> None:
    """A second stream for the same (node, agent): the newer stream always takes over (a restarted
    agent has a new boot id and must get in while its old TCP stream is still half-open). The old
    stream is closed and applies nothing more; its faults stay until the new stream's snapshot
    replaces them. Logged as "agent stream taken over" with reason ``reconnect`` (same boot id)
    or ``restart`` (another boot id: a restarted agent, or two agents claiming one node — then
    the log shows the two peers taking turns) and counted by reason in ``takeovers``."""
    reason = takeover_reason(old, new)
    old.closed = True
    old.queue.put_nowait(None)
    takeovers.labels(reason).inc()
    event(
        log,
        logging.INFO if reason == "reconnect" else logging.WARNING,
        "agent stream taken over",
        node=new.node,
        agent=new.agent,
        reason=reason,
        old_peer=old.peer,
        new_peer=new.peer,
        old_boot_id=old.boot_id[:64],
        new_boot_id=new.boot_id[:64],
        old_idle_s=round(time.time() - old.last_seen, 1),
    )
