"""The unchanged resync of the agent stream (issue 18; agent.proto's header): what ClusterD keeps of
an agent's last full snapshot and how it answers the agent's digest claim.

A full Snapshot that carries a well-formed ``digest`` (:data:`DIGEST_SIZE` bytes), has no pending
sources and was applied whole (no fault refused as another origin's) leaves a *mark* on its scope
(node, agent) in the fault center (:mod:`clusterd.scopemarks`): the digest followed by the node
view it gave (conditions, device states, node status) as JSON. The center stores the mark in the
transaction of the faults that snapshot left and drops it with any later change of that agent's
faults (the mark's bytes: the digest, the node status' length and UTF-8, ``[conditions, devices]``
as JSON), so a held mark always describes the stored state. A snapshot with pending sources leaves
none (its node status and faults merge with what was there: not one fixed state).

A claim (an empty Delta with ``snapshot_digest``, or the same carried by the Hello's
``snapshot_digest`` and ``claim_seq``) is answered ``DIGEST_MATCH`` when the held mark
starts with that digest: re-applying that very snapshot would change no fault (the center's
snapshot diff is idempotent), so ClusterD applies only the node view from the mark (as a full
snapshot would, replacing: it may differ from the registry's after a crash, whose rows are flushed
on their own clock) and clears the agent's pending sources. Anything else (no mark, another
digest, a malformed claim) is ``DIGEST_MISMATCH`` and the agent sends its full snapshot.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from clusterd.ingest.agentinput import AgentInputError, condition_view, device_view
from clusterd.nodes import NodeRegistry
from faultmesh._pb import agent_pb2
from faultmesh.log import event

log = logging.getLogger("clusterd.agents")

DIGEST_SIZE = 32  # faultmesh.agent.DIGEST_SIZE (a service does not import the agent client)


def snapshot_views(body: agent_pb2.Snapshot) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The node-registry views (conditions, devices) of a snapshot."""
    return [condition_view(c) for c in body.conditions], [device_view(d) for d in body.devices]


def snapshot_mark(body: agent_pb2.Snapshot, views, pending: frozenset[str], refused: int) -> bytes | None:
    """The mark a full snapshot leaves (see the module docstring), or None when it leaves none.
    Raises :class:`AgentInputError` (``bad_digest``) for a digest of another size: the snapshot is
    still applied, without a mark."""
    digest = body.digest
    if not digest:
        return None
    if len(digest) != DIGEST_SIZE:
        raise AgentInputError(f"bad_digest: snapshot digest of {len(digest)} bytes, not {DIGEST_SIZE}")
    if pending or refused:
        return None
    conditions, devices = views
    status = body.node_status.encode()  # at most 32 chars (agentinput.check_state)
    return digest + bytes((len(status),)) + status + orjson.dumps([conditions, devices])


def claim_error(body: agent_pb2.Delta) -> str:
    """Why a claim (a Delta with ``snapshot_digest``) is malformed, "" when it is not: a digest of
    another size, or anything else carried along (a claim is an otherwise empty Delta)."""
    if len(body.snapshot_digest) != DIGEST_SIZE:
        return f"bad_digest: claim digest of {len(body.snapshot_digest)} bytes, not {DIGEST_SIZE}"
    if not body.seq:
        return "bad_digest: a claim without a seq"
    if (
        body.upserts
        or body.removals
        or body.conditions
        or body.devices
        or body.ping_results
        or body.slownode_reports
        or body.node_status
    ):
        return "bad_digest: a claim carries nothing but the digest"
    return ""


def apply_claim(nodes: NodeRegistry, node: str, agent: str, mark: bytes | None, digest: bytes) -> bool:
    """Answer a claim of ``digest`` against the held ``mark``: False (a mismatch; a corrupt mark is
    logged and is one) or True once what that snapshot did besides its stored, unchanged faults is
    done: its node view replaces the node's (as a snapshot without pending sources does; skipped
    when the registry holds exactly that view already, the usual case, compared as encoded bytes
    without decoding the mark) and ``agent`` has no pending source."""
    if mark is None or mark[:DIGEST_SIZE] != digest:
        return False
    try:
        n = mark[DIGEST_SIZE]
        status = mark[DIGEST_SIZE + 1 : DIGEST_SIZE + 1 + n].decode()
        blob = mark[DIGEST_SIZE + 1 + n :]
        st = nodes.get(node)
        if (
            st is None
            or (status and st.node_status != status)
            or orjson.dumps(list(st.views_of(agent))) != blob
        ):
            conditions, devices = orjson.loads(blob)
            nodes.update(
                node, conditions=conditions, devices=devices, status=status, replace=True, owner=agent
            )
    except (IndexError, ValueError, TypeError, KeyError) as e:
        event(log, logging.ERROR, "stored snapshot mark unreadable", node=node, agent=agent, error=repr(e))
        return False
    nodes.set_pending(node, agent, ())
    return True


def snapshot_counters(registry: CollectorRegistry) -> tuple[Any, Any, Any]:
    """``faultmesh_agent_snapshots_total`` children (full, unchanged, mismatch)."""
    c = Counter(
        "faultmesh_agent_snapshots_total",
        "Agent resyncs: full snapshots applied, digest claims matched (unchanged) or not (mismatch)",
        ["result"],
        registry=registry,
    )
    full, unchanged, mismatch = (c.labels(r) for r in ("full", "unchanged", "mismatch"))
    return full, unchanged, mismatch
