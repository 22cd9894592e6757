"""Checks of what an agent sends on its stream (design.md "Agent stream", issue 19 #6).

Every limit here holds at the limit and is refused at limit + 1 (tests/clusterd/test_agent_limits.py):
a Hello's node name (1..253 of ``[A-Za-z0-9._-]``), agent name (:data:`AGENT_RE`), ip (≤64), serial
number (≤128); per node at most :data:`MAX_CONDITIONS` conditions and :data:`MAX_DEVICES` device
states, counted as what the node would hold after the message; per fault a printable code of ≤64
chars (:data:`CODE_RE`), a source of ≤64, a known level, times before 2100, ≤64 attributes; at most 64
pending sources. A message that breaks one raises :class:`AgentInputError`; its reason (the first word)
labels ``faultmesh_rejected_requests_total{service="agent"}``.

Sequence numbers (:func:`seq_error`): after the stream's first message every Delta carries the
previous seq + 1 and a Snapshot any larger seq (it replaces everything, so it heals a gap).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from clusterd.nodes import NodeRegistry
from faultmesh._pb import agent_pb2
from faultmesh.levels import KNOWN_LEVELS
from faultmesh.model import ASSERTIONS, Fault

MAX_FIELD_LEN = 256
MAX_CONDITIONS = 64  # per node
MAX_DEVICES = 4096  # per node
MAX_TIME_MS = 4_102_444_800_000  # 2100-01-01
CODE_RE = re.compile(r"^[\x21-\x7e]{1,64}\Z")  # printable, no spaces: hex, public and switch codes
AGENT_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z")  # \Z: "$" also matches before a final newline


class AgentInputError(ValueError):
    """An agent message that cannot be applied; the reason is the first word of the message."""


def owned_only(owner_of: Any, agent: str, ups: list, rms: list) -> tuple[list, list, int]:
    """What ``agent`` may change of upserts ``ups`` (Faults) and removals ``rms`` (FaultKeys): keys
    it owns or nobody owns yet (``owner_of(key)``: the origin holding a key, or None), never a
    ``public:*`` source. Returns (upserts, removals, how many were refused)."""

    def mine(key, source: str) -> bool:
        owner = owner_of(key)
        return (owner is None or owner == agent) and not source.startswith("public:")

    keep_ups = [f for f in ups if mine((f.node, f.device_type, f.device_id, f.code, f.source), f.source)]
    keep_rms = [k for k in rms if mine(k, k.source)]
    return keep_ups, keep_rms, len(ups) - len(keep_ups) + len(rms) - len(keep_rms)


def seq_error(last_seq: int, kind: str, seq: int) -> str:
    """Why ``seq`` of a ``kind`` ("snapshot" / "delta") message cannot follow ``last_seq`` (0: the
    stream's first message, which sets the base), or "" when it can. Reasons: ``seq_replay`` (not
    above the last: a duplicate or an old message), ``seq_gap`` (a Delta skipped a seq)."""
    if last_seq == 0:
        return ""
    if seq <= last_seq:
        return "seq_replay"
    if kind == "delta" and seq != last_seq + 1:
        return "seq_gap"
    return ""


def check_state(
    nodes: NodeRegistry,
    node: str,
    conditions,
    devices,
    node_status: str,
    replace: bool = False,
    sent: tuple[set, set] | None = None,
) -> None:
    """Node status, conditions and device states of one message to ``node``; ``replace``: a snapshot
    (they become the whole set), else merged into what the node holds. ``sent``: the condition
    types and (device_type, device_id) keys the stream's earlier accepted messages add, counted
    with the registry's (those still committing are not in it yet: messages are pipelined).
    Raises AgentInputError."""
    if len(node_status) > 32:
        raise AgentInputError("bad_state: node_status longer than 32 chars")
    if not conditions and not devices:  # most deltas: nothing to count
        return
    if len(conditions) > MAX_CONDITIONS:
        raise AgentInputError(f"bad_state: more than {MAX_CONDITIONS} conditions on one node")
    if len(devices) > MAX_DEVICES:
        raise AgentInputError(f"bad_state: more than {MAX_DEVICES} devices on one node")
    if not replace:  # what the node would hold after this message
        # (a snapshot replaces: it holds at most what it sends, counted above)
        st = nodes.get(node)
        sent_conditions, sent_devices = sent or ((), ())
        if conditions:
            held_c = set(st.conditions) if st is not None else set()
            if len(held_c.union(sent_conditions, (c.type for c in conditions))) > MAX_CONDITIONS:
                raise AgentInputError(f"bad_state: more than {MAX_CONDITIONS} conditions on one node")
        if devices:
            held = {(d.get("device_type"), d.get("device_id")) for d in st.devices.values()} if st else set()
            if len(held.union(sent_devices, ((d.device_type, d.device_id) for d in devices))) > MAX_DEVICES:
                raise AgentInputError(f"bad_state: more than {MAX_DEVICES} devices on one node")
    for c in conditions:
        if not c.type or len(c.type) > 64 or len(c.reason) > 256 or len(c.message) > 1024:
            raise AgentInputError("bad_state: condition type/reason/message empty or too long")
    for d in devices:
        if len(d.device_type) > 64 or len(d.health) > 32 or len(d.network_health) > 32 or len(d.level) > 64:
            raise AgentInputError("bad_state: device fields too long")


def check_fault(node: str, m: agent_pb2.Fault) -> Fault:
    """One wire fault of the stream of ``node`` as a :class:`Fault`. Raises AgentInputError."""
    mnode, code, source, device_type, device_id = m.node, m.code, m.source, m.device_type, m.device_id
    if mnode and mnode != node:
        raise AgentInputError(f"foreign_node: fault for node {mnode!r} on the stream of {node!r}")
    if not CODE_RE.match(code) or not source or len(source) > 64:
        raise AgentInputError("bad_fault: code (printable, ≤64 chars) and source (≤64) are required")
    if len(device_type) > 64 or device_id < -1 or device_id > 1 << 20:
        raise AgentInputError("bad_fault: device out of range")
    level, first, last, assertion = m.level, m.first_seen_ms, m.last_seen_ms, m.assertion
    if level not in KNOWN_LEVELS:
        raise AgentInputError(f"bad_fault: unknown fault level {level[:64]!r}")
    if not (0 <= first <= MAX_TIME_MS and 0 <= last <= MAX_TIME_MS):
        raise AgentInputError("bad_fault: first/last seen time out of range")
    if assertion and assertion not in ASSERTIONS:
        raise AgentInputError(f"bad_fault: assertion {assertion!r}")
    attrs = m.attributes
    if attrs:  # most faults carry none: no copy, no generator
        attrs = dict(attrs)
        if len(attrs) > 64 or any(len(k) > MAX_FIELD_LEN or len(v) > 4096 for k, v in attrs.items()):
            raise AgentInputError("bad_fault: too many or too long attributes")
    else:
        attrs = {}
    # the one decoder of a wire fault (faultmesh.wire encodes): every field read once
    return Fault(source, node, device_type, device_id, code, level, assertion or "occur", first, last, attrs)


CHECK_SLICE = 4096  # faults checked between two turns of the event loop (check_faults)


async def check_faults(node: str, faults) -> list[Fault]:
    """:func:`check_fault` of each wire fault of ``faults`` (a Snapshot's), giving the event loop a
    turn every :data:`CHECK_SLICE` faults: a snapshot of 65,536 faults (sent in parts) held the loop
    for 0.4 s at once. Raises AgentInputError."""
    out: list[Fault] = []
    for i in range(0, len(faults), CHECK_SLICE):
        if i:
            await asyncio.sleep(0)
        out.extend([check_fault(node, m) for m in faults[i : i + CHECK_SLICE]])
    return out


def pending_sources(sources) -> frozenset[str]:
    """A snapshot's ``pending_sources`` (at most 64 names of ≤64 chars). Raises AgentInputError."""
    if len(sources) > 64 or any(not x or len(x) > 64 for x in sources):
        raise AgentInputError("bad_state: more than 64 pending sources or a bad source name")
    return frozenset(sources)


MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE = 32, 63, 256  # a Hello's labels (the agent's modes)


def bad_labels(labels) -> bool:
    """Whether a Hello's ``labels`` break their limits (more than :data:`MAX_LABELS`, an empty key or
    one over :data:`MAX_LABEL_KEY` characters, a value over :data:`MAX_LABEL_VALUE`)."""
    return len(labels) > MAX_LABELS or any(
        not 0 < len(k) <= MAX_LABEL_KEY or len(v) > MAX_LABEL_VALUE for k, v in labels.items()
    )


def valid_hello(h: agent_pb2.Hello) -> str:
    """The reason Hello ``h`` is refused (``no_hello``: bad node name, ``bad_hello``), "" if none."""
    if not (0 < len(h.node) <= 253 and h.node.isascii() and all(c.isalnum() or c in "-._" for c in h.node)):
        return "no_hello"
    if not AGENT_RE.match(h.agent or "agent") or len(h.node_ip) > 64 or len(h.node_sn) > 128:
        return "bad_hello"
    return "bad_hello" if bad_labels(h.labels) else ""


def condition_view(c: agent_pb2.Condition) -> dict[str, Any]:
    """The node-registry view of one condition."""
    return {
        "type": c.type,
        "active": c.active,
        "reason": c.reason,
        "message": c.message,
        "since_ms": c.since_ms,
    }


def device_view(d: agent_pb2.DeviceState) -> dict[str, Any]:
    """The node-registry view of one device state."""
    return {
        "device_type": d.device_type,
        "device_id": d.device_id,
        "phy_id": d.phy_id,
        "health": d.health,
        "network_health": d.network_health,
        "level": d.level,
        "super_pod_id": d.super_pod_id,
        "server_index": d.server_index,
    }
