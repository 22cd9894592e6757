"""The agent's state and its snapshot digest (design.md "Agent stream"; split out of
:mod:`faultmesh.agent`, which re-exports every name here).

:class:`AgentState` is what an agent (NodeD, deviced) holds as its truth for its node, with the change
tracking the stream's deltas come from; :func:`snapshot_digest` is the digest of a snapshot of it that
ClusterD compares on a reconnect (issue 18, agent.proto's header).
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from faultmesh._pb import agent_pb2
from faultmesh.model import Fault, FaultKey
from faultmesh.wire import fault_to_pb, key_to_pb

DELTA_MAX_BYTES = 1 << 20  # fault changes per delta, about (ClusterD takes messages up to 4 MiB)
SNAPSHOT_PART_BYTES = 1 << 20  # a Snapshot sent in parts: about this many bytes a part
DIGEST_SIZE = 32  # bytes of a snapshot digest (BLAKE2b-256)
_DIGEST_TAG = b"faultmesh.v1.Snapshot/1\0"  # a new canonical form gets a new tag: never a false match


def snapshot_digest(snap: agent_pb2.Snapshot) -> bytes:
    """The digest (:data:`DIGEST_SIZE` bytes, BLAKE2b) of everything ClusterD stores from ``snap``:
    every field but ``seq`` and ``digest`` itself, i.e. each fault with its first/last-seen times and
    attributes, the conditions with ``since_ms``, the device states, the node status and the pending
    sources. Canonical for a Snapshot built by :meth:`AgentState.snapshot` (lists in key order,
    deterministic protobuf encoding: map entries sorted), so the same state gives the same digest
    after an agent restart (the boot id is in Hello, not here). ``snap`` is left as it was."""
    seq, digest = snap.seq, snap.digest
    snap.seq, snap.digest = 0, b""
    try:
        raw = snap.SerializeToString(deterministic=True)
    finally:
        snap.seq, snap.digest = seq, digest
    return hashlib.blake2b(_DIGEST_TAG + raw, digest_size=DIGEST_SIZE).digest()


def snapshot_parts(
    snap: agent_pb2.Snapshot, max_bytes: int = SNAPSHOT_PART_BYTES
) -> list[agent_pb2.Snapshot]:
    """``snap`` as the parts of agent.proto's "Snapshot parts": ``[snap]`` when it takes at most
    ``max_bytes`` (bytes encoded); else part 0 with every field but the faults (digest included:
    it covers the whole state) and the first faults, then parts with only ``seq`` and faults, each
    part's faults stopping at about ``max_bytes`` (at least one fault a part, so a part takes at
    most ``max_bytes`` plus one fault). Every part carries ``seq``, ``part`` (its index) and
    ``parts`` (the count). Merged in order (protobuf ``MergeFrom``) the parts give ``snap`` back;
    ``snap`` is left as it was."""
    if snap.ByteSize() <= max_bytes:
        return [snap]
    first = agent_pb2.Snapshot()
    first.CopyFrom(snap)
    first.ClearField("faults")
    parts, part, size = [first], first, first.ByteSize()
    for f in snap.faults:
        n = f.ByteSize() + 4  # the field's tag and length
        if size + n > max_bytes and part.faults:
            part = agent_pb2.Snapshot(seq=snap.seq)
            parts.append(part)
            size = part.ByteSize()
        part.faults.append(f)
        size += n
    for i, p in enumerate(parts):
        p.part, p.parts = i, len(parts)
    return parts


class AgentState:
    """The agent's current state, with change tracking for deltas.

    ``faults``: FaultKey -> Fault; ``conditions``: type -> Condition pb; ``devices``:
    (device_type, device_id) -> DeviceState pb; ``node_status``: str. Mutators return True when
    something changed. Events (ping rows, slow-node reports) go to bounded deques (``max_events``,
    oldest dropped and counted in ``dropped_events``).
    """

    def __init__(self, node: str, max_events: int = 20_000) -> None:
        self.node = node
        self.faults: dict[FaultKey, Fault] = {}
        self.conditions: dict[str, agent_pb2.Condition] = {}
        self.devices: dict[tuple[str, int], agent_pb2.DeviceState] = {}
        self.node_status = ""
        self.ping_results: collections.deque[agent_pb2.PingResult] = collections.deque(maxlen=max_events)
        self.slownode_reports: collections.deque[agent_pb2.SlowNodeReport] = collections.deque(
            maxlen=max_events
        )
        self.dropped_events = 0
        self._dirty_faults: set[FaultKey] = set()
        self._dirty_conditions: set[str] = set()
        self._dirty_devices: set[tuple[str, int]] = set()
        self._status_dirty = False
        self.pending_sources: set[str] = set()
        self._pending_changed = False
        self.on_change: Callable[[], None] = lambda: None

    # -- mutators ---------------------------------------------------------------------------
    def upsert(self, fault: Fault) -> bool:
        """Add or update one fault (node forced to this agent's node). Keeps the first-seen time."""
        if fault.node != self.node:
            fault = replace(fault, node=self.node)
        old = self.faults.get(fault.key)
        if old is not None:
            if old.same_content(fault):
                return False
            fault = fault.with_times(old.first_seen_ms or fault.first_seen_ms, fault.last_seen_ms)
        self.faults[fault.key] = fault
        self._dirty_faults.add(fault.key)
        self.on_change()
        return True

    def remove(self, key: FaultKey) -> bool:
        """Remove one fault (recovered). Returns True when it was present."""
        if self.faults.pop(key, None) is None:
            return False
        self._dirty_faults.add(key)
        self.on_change()
        return True

    def replace_source(self, source: str, faults: Iterable[Fault]) -> bool:
        """Make ``faults`` the complete set reported by ``source`` (absent ones recover)."""
        new = {}
        for f in faults:
            if f.node != self.node:
                f = replace(f, node=self.node)
            new[f.key] = f
        changed = False
        for key in [k for k in self.faults if k.source == source and k not in new]:
            changed |= self.remove(key)
        for f in new.values():
            changed |= self.upsert(f)
        return changed

    def set_condition(self, type_: str, active: bool, reason: str = "", message: str = "") -> bool:
        """Set a node condition (BMCUnreachable, ...). ``since_ms`` is kept while ``active`` is unchanged."""
        old = self.conditions.get(type_)
        if old is not None and old.active == active and old.reason == reason and old.message == message:
            return False
        since = old.since_ms if old is not None and old.active == active else int(time.time() * 1000)
        self.conditions[type_] = agent_pb2.Condition(
            type=type_, active=active, reason=reason, message=message, since_ms=since
        )
        self._dirty_conditions.add(type_)
        self.on_change()
        return True

    def set_device(self, state: agent_pb2.DeviceState) -> bool:
        """Set one device's state (deviced)."""
        key = (state.device_type, state.device_id)
        if self.devices.get(key) == state:
            return False
        self.devices[key] = state
        self._dirty_devices.add(key)
        self.on_change()
        return True

    def set_node_status(self, status: str) -> bool:
        """Set the node status string (Healthy / PreSeparate / UnHealthy)."""
        if status == self.node_status:
            return False
        self.node_status = status
        self._status_dirty = True
        self.on_change()
        return True

    def add_ping_results(self, rows: Iterable[agent_pb2.PingResult]) -> None:
        """Queue pingmesh result rows for ClusterD (bounded, oldest dropped)."""
        for r in rows:
            if len(self.ping_results) == self.ping_results.maxlen:
                self.dropped_events += 1
            self.ping_results.append(r)
        self.on_change()

    def add_slownode_report(self, report: agent_pb2.SlowNodeReport) -> None:
        """Queue one node-level slow-node result for ClusterD (bounded, oldest dropped)."""
        if len(self.slownode_reports) == self.slownode_reports.maxlen:
            self.dropped_events += 1
        self.slownode_reports.append(report)
        self.on_change()

    def expect_sources(self, sources: Iterable[str]) -> None:
        """Mark fault ``sources`` (``Fault.source`` names) pending: they have not completed their
        first poll since the agent started, so ClusterD keeps what it had for them (issue 20)."""
        new = set(sources) - self.pending_sources
        if new:
            self.pending_sources |= new
            self._pending_changed = True
            self.on_change()

    def source_ready(self, sources: Iterable[str]) -> bool:
        """Fault ``sources`` completed their first poll (their faults in this state are complete):
        the next message is a Snapshot, which lets ClusterD clear what they no longer report.
        True when one of them was pending."""
        done = self.pending_sources & set(sources)
        if not done:
            return False
        self.pending_sources -= done
        self._pending_changed = True
        self.on_change()
        return True

    @property
    def needs_snapshot(self) -> bool:
        """True when the pending sources changed since the last snapshot (send a Snapshot, not a Delta)."""
        return self._pending_changed

    # -- wire ---------------------------------------------------------------------------------
    def has_pending(self) -> bool:
        """True when a delta would carry something."""
        return bool(
            self._pending_changed
            or self._dirty_faults
            or self._dirty_conditions
            or self._dirty_devices
            or self._status_dirty
            or self.ping_results
            or self.slownode_reports
        )

    def snapshot(self, seq: int) -> agent_pb2.Snapshot:
        """The full state as a Snapshot (with the pending sources and its :func:`snapshot_digest`;
        faults, conditions and devices in key order); clears dirty marks (events stay queued for
        the next delta)."""
        self._dirty_faults.clear()
        self._dirty_conditions.clear()
        self._dirty_devices.clear()
        self._status_dirty = False
        self._pending_changed = False
        snap = agent_pb2.Snapshot(
            seq=seq,
            faults=[fault_to_pb(self.faults[k]) for k in sorted(self.faults)],
            conditions=[self.conditions[t] for t in sorted(self.conditions)],
            devices=[self.devices[k] for k in sorted(self.devices)],
            node_status=self.node_status,
            pending_sources=sorted(self.pending_sources),
        )
        snap.digest = snapshot_digest(snap)
        return snap

    def take_delta(self, seq: int, max_bytes: int = DELTA_MAX_BYTES) -> agent_pb2.Delta:
        """Changes since the last snapshot/delta, plus queued events; clears what it took. The fault
        changes stop at about ``max_bytes`` (bytes, at least one change): the rest stay pending for
        the next delta, so a fault storm never makes a message over ClusterD's 4 MiB receive limit
        (clusterd.md §1; one such message failed the whole stream, INTERNAL "Internal error from
        Core", and every retry again)."""
        d = agent_pb2.Delta(seq=seq)
        size, taken = 0, []
        for key in self._dirty_faults:
            if taken and size >= max_bytes:
                break
            taken.append(key)
            f = self.faults.get(key)
            if f is None:
                d.removals.append(key_to_pb(key))
                size += d.removals[-1].ByteSize()
            else:
                d.upserts.append(fault_to_pb(f))
                size += d.upserts[-1].ByteSize()
        d.conditions.extend(self.conditions[t] for t in self._dirty_conditions)
        d.devices.extend(self.devices[k] for k in self._dirty_devices)
        if self._status_dirty:
            d.node_status = self.node_status
        d.ping_results.extend(self.ping_results)
        d.slownode_reports.extend(self.slownode_reports)
        self.ping_results.clear()
        self.slownode_reports.clear()
        self._dirty_faults.difference_update(taken)
        self._dirty_conditions.clear()
        self._dirty_devices.clear()
        self._status_dirty = False
        return d
