"""One agent stream's state on the ClusterD side (:mod:`clusterd.ingest.agents`): the session of a
connected agent and the messages its writer sends in order."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

MAX_QUEUED = 1024  # control messages and error acks waiting for one stream's writer
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
    control_seq: int = 0
    acked_control: int = 0
    closed: bool = False
    stale: bool = False  # nothing arrived for the hub's stale_after_s (a hung agent)
