"""Model <-> protobuf for the agent stream (faultmesh.v1). Encoding lives here; a wire fault is decoded
only where it is validated, :func:`clusterd.ingest.agentinput.check_fault` (one decoder, issue 28)."""

from __future__ import annotations

from faultmesh._pb import agent_pb2
from faultmesh.model import Fault, FaultKey


def fault_to_pb(f: Fault) -> agent_pb2.Fault:
    """Fault -> agent_pb2.Fault."""
    return agent_pb2.Fault(
        source=f.source,
        node=f.node,
        device_type=f.device_type,
        device_id=f.device_id,
        code=f.code,
        level=f.level,
        assertion=f.assertion,
        first_seen_ms=f.first_seen_ms,
        last_seen_ms=f.last_seen_ms,
        attributes=f.attributes,
    )


def key_to_pb(k: FaultKey) -> agent_pb2.FaultKey:
    """FaultKey -> agent_pb2.FaultKey (the node is implied by the stream)."""
    return agent_pb2.FaultKey(source=k.source, device_type=k.device_type, device_id=k.device_id, code=k.code)


def key_from_pb(m: agent_pb2.FaultKey, node: str) -> FaultKey:
    """agent_pb2.FaultKey on the stream of ``node`` -> FaultKey."""
    return FaultKey(node, m.device_type, m.device_id, m.code, m.source)


# The response header of a ClusterD that collects Snapshot parts (agent.proto's "Snapshot parts"):
# the most bytes (decimal) of one snapshot it collects. Sent when it accepts a stream.
SNAPSHOT_MAX_BYTES_HEADER = "faultmesh-snapshot-max-bytes"


def snapshot_max_bytes(metadata) -> int:
    """The bytes of one snapshot in parts a ClusterD takes, read from its response headers
    ``metadata`` (``(key, value)`` pairs, or None): 0 when it sent no (valid) such header, i.e. an
    older ClusterD that takes a snapshot only as one message."""
    for key, value in metadata or ():
        if key == SNAPSHOT_MAX_BYTES_HEADER:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return int(text) if text.isdigit() and len(text) < 19 else 0
    return 0
