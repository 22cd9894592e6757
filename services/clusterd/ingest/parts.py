"""Snapshot parts (agent.proto's "Snapshot parts"): ClusterD's collection of a Snapshot an agent sends
in several messages, for :class:`clusterd.ingest.agents.AgentHub`.

A state over the 4 MiB receive limit (a node near the 65,536-fault cap with large attributes) comes
as parts: each a Snapshot carrying the snapshot's one seq, its index ``part`` and the count
``parts``. :meth:`SnapshotParts.take` holds them on the stream's session (merged in order, protobuf
``MergeFrom``: the snapshot is the parts' merge) until the last one, and then hands the whole
snapshot to the hub, which checks and applies it as it does a one-message snapshot: one store
transaction, the same replacement, digest mark, pending sources and node view; its seq is acked once
that is stored. Nothing of a snapshot is applied before its last part; a stream that ends, is taken
over or goes stale (a hung agent) between parts drops what it collected (:meth:`SnapshotParts.drop`,
logged ``snapshot parts dropped``), so nothing is half-applied and nothing acked that was not stored.

Bounds: one snapshot of a stream takes at most :data:`MAX_SNAPSHOT_PARTS` parts and
:data:`MAX_SNAPSHOT_BYTES` bytes (encoded), the value ClusterD's response headers advertise
(:data:`faultmesh.wire.SNAPSHOT_MAX_BYTES_HEADER`, so an agent does not send what would be
refused); all streams together hold at most :data:`MAX_HELD_BYTES`. A snapshot over its own bounds
is refused (``snapshot_too_large``: acked with that error, its remaining parts read and discarded,
nothing applied, the stream goes on); one that finds the shared bound full is refused with
``resync: snapshot_parts_busy`` and its stream ended, so its agent comes back after its backoff and
sends it again. A part that does not follow its predecessor (another seq, index or count, a first
part missing, a Delta between two parts) is ``resync: snapshot_part_order`` and ends the stream.
Each refusal is counted in ``faultmesh_rejected_requests_total{service="agent",reason}`` and logged
``agent message rejected``; parts are counted in ``faultmesh_agent_snapshot_parts_total{result}``
(``complete``: parts of snapshots handed on whole, to the checks of a one-message snapshot, which
may still refuse it -- ``faultmesh_rejected_requests_total``; ``dropped``: collected and then
dropped), and
``faultmesh_agent_snapshot_parts_held_bytes`` is what the streams hold now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.ingest.agentinput import seq_error
from faultmesh._pb import agent_pb2
from faultmesh.log import event
from faultmesh.wire import SNAPSHOT_MAX_BYTES_HEADER

log = logging.getLogger("clusterd.agents")

MAX_SNAPSHOT_PARTS = 256  # parts of one snapshot (agents send about 1 MiB a part)
MAX_SNAPSHOT_BYTES = 64 << 20  # encoded bytes of one snapshot in parts (65,536 faults of 1 KiB)
MAX_HELD_BYTES = 256 << 20  # what all streams together hold for collection


@dataclass(slots=True)
class Collection:
    """The parts of one snapshot a stream has sent so far: ``whole`` is their merge."""

    seq: int
    parts: int  # the count the first part announced
    next: int = 1  # the index of the part that must come next
    bytes: int = 0  # encoded bytes held (counted in the shared total)
    refused: bool = False  # over its bounds: the rest of its parts are discarded
    whole: agent_pb2.Snapshot = field(default_factory=agent_pb2.Snapshot)


# resync(session, reason, seq, detail): refuse a message for its order and end the stream (the hub's)
Resync = Callable[[Any, str, int, str], None]


class SnapshotParts:
    """Collects the Snapshot parts of every stream of one hub, within the bounds of the module
    docstring. ``reject(reason, **fields)`` counts and logs a refusal, ``ack(session, seq, error)``
    queues an Ack, ``resync`` refuses a message for its order and ends the stream (the hub's)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        reject: Callable[..., None],
        ack: Callable[[Any, int, str], None],
        resync: Resync,
        max_parts: int = MAX_SNAPSHOT_PARTS,
        max_bytes: int = MAX_SNAPSHOT_BYTES,
        max_held_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        self._reject, self._ack, self._resync = reject, ack, resync
        self.max_parts, self.max_bytes, self.max_held_bytes = max_parts, max_bytes, max_held_bytes
        self.held = 0  # bytes all streams hold now
        counted = Counter(
            "faultmesh_agent_snapshot_parts_total",
            "Snapshot parts received: complete (their snapshot handed on whole to the checks) or dropped"
            " (never applied)",
            ["result"],
            registry=registry,
        )
        self._complete, self._dropped = counted.labels("complete"), counted.labels("dropped")
        self._held_gauge = Gauge(
            "faultmesh_agent_snapshot_parts_held_bytes",
            "Encoded bytes of snapshot parts held until their snapshot's last part",
            registry=registry,
        )

    def header(self) -> tuple[tuple[str, str], ...]:
        """The response header that says this ClusterD collects parts (sent when a stream is accepted)."""
        return ((SNAPSHOT_MAX_BYTES_HEADER, str(self.max_bytes)),)

    def take(self, s: Any, kind: str, body: Any) -> agent_pb2.Snapshot | None:
        """Collect ``body``, a ``kind`` message of session ``s`` that is a part (``parts`` > 1) or
        comes while ``s`` collects one (``s.parts`` set). Returns the whole snapshot when ``body``
        was its last part (``seq`` set, ``part``/``parts`` cleared), else None: held, discarded or
        refused (then already acked or the stream ended, see the module docstring). Part 0 is
        checked for its seq like a one-message snapshot and sets the stream's last seq."""
        c: Collection | None = s.parts
        if c is None:
            if kind != "snapshot" or body.part != 0:
                self._resync(s, "snapshot_part_order", body.seq,
                             f"snapshot part {body.part} of {body.parts} without its part 0")  # fmt: skip
                return None
            bad = seq_error(s.last_seq, kind, body.seq)
            if bad:
                self._resync(s, bad, body.seq, f"snapshot seq {body.seq} after {s.last_seq}")
                return None
            s.last_seq = body.seq
            c = s.parts = Collection(body.seq, body.parts, next=0)
            if body.parts > self.max_parts:
                self._refuse(s, c, f"{body.parts} parts, limit {self.max_parts}")
        elif kind != "snapshot" or (body.seq, body.part, body.parts) != (c.seq, c.next, c.parts):
            what = f"snapshot part {body.part} of {body.parts}" if kind == "snapshot" else "delta"
            self.drop(s, "out of order")
            self._resync(s, "snapshot_part_order", body.seq,
                         f"{what} seq {body.seq} while part {c.next} of {c.parts} of seq {c.seq} is due")  # fmt: skip
            return None
        c.next += 1
        last = c.next == c.parts
        if not c.refused:
            size = body.ByteSize()
            if c.bytes + size > self.max_bytes:
                self._refuse(s, c, f"over {self.max_bytes} bytes at part {body.part}")
            elif self.held + size > self.max_held_bytes:
                self.drop(s, "clusterd busy")
                self._resync(s, "snapshot_parts_busy", c.seq,
                             f"snapshot parts of all streams over {self.max_held_bytes} bytes")  # fmt: skip
                return None
            else:
                c.whole.MergeFrom(body)
                self._hold(c, size)
        if not last:
            return None
        s.parts = None
        if c.refused:
            return None
        self._hold(c, -c.bytes)
        self._complete.inc(c.parts)
        whole = c.whole
        whole.seq = c.seq
        whole.ClearField("part")
        whole.ClearField("parts")
        return whole

    def drop(self, s: Any, why: str) -> None:
        """Forget what session ``s`` collected (its stream ended, was taken over, or sent a part out
        of order): logged ``snapshot parts dropped`` with ``why``, counted ``dropped``."""
        c: Collection | None = s.parts
        if c is None:
            return
        s.parts = None
        kept = c.next if not c.refused else 0
        self._hold(c, -c.bytes)
        if kept:
            self._dropped.inc(kept)
        event(log, logging.WARNING, "snapshot parts dropped", node=s.node, agent=s.agent, seq=c.seq,
              parts=c.next, of=c.parts, why=why)  # fmt: skip

    def _refuse(self, s: Any, c: Collection, why: str) -> None:
        """Refuse ``c`` for its own bounds: acked ``snapshot_too_large``, its parts freed, the rest
        discarded as they come."""
        detail = f"snapshot_too_large: snapshot seq {c.seq} of node {s.node}: {why}"
        self._reject("snapshot_too_large", node=s.node, agent=s.agent, detail=detail)
        self._ack(s, c.seq, detail)
        self._dropped.inc(c.next)
        self._hold(c, -c.bytes)
        c.refused = True
        c.whole = agent_pb2.Snapshot()

    def _hold(self, c: Collection, size: int) -> None:
        c.bytes += size
        self.held += size
        self._held_gauge.set(self.held)
