"""The answer to an agent stream's first message when it is not a valid ``Hello`` (design.md "Agent
stream"): the rejection reason and the ``INVALID_ARGUMENT`` message naming the field that broke its
limit (the limits are :func:`clusterd.ingest.agentinput.valid_hello`'s)."""

from __future__ import annotations

from clusterd.ingest.agentinput import AGENT_RE, MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_LABELS, valid_hello
from faultmesh._pb import agent_pb2


def hello_refusal(first: agent_pb2.AgentMessage) -> tuple[str, str] | None:
    """None when ``first`` is a valid Hello; else ``(reason, message)``: reason ``no_hello`` (not a
    Hello, or its node name is not one) or ``bad_hello`` (agent name, ``node_ip`` over 64 characters,
    ``node_sn`` over 128, labels over their limits: :func:`clusterd.ingest.agentinput.bad_labels`), the reason label of ``faultmesh_rejected_requests_total{service="agent"}``;
    message the status text the agent is told (at most 64 characters of what it sent are quoted)."""
    if first.WhichOneof("body") != "hello":
        return "no_hello", "first message must be Hello with a node"
    h = first.hello
    bad = valid_hello(h)
    if not bad:
        return None
    if bad == "no_hello":
        return bad, f"Hello: node must match [A-Za-z0-9._-]{{1,253}}, got {h.node[:64]!r}"
    if not AGENT_RE.match(h.agent or "agent"):
        return bad, f"Hello: agent must match [a-z][a-z0-9_-]{{0,31}}, got {h.agent[:64]!r}"
    if len(h.node_ip) > 64:
        return bad, f"Hello: node_ip must be at most 64 characters, got {len(h.node_ip)}"
    if len(h.node_sn) > 128:
        return bad, f"Hello: node_sn must be at most 128 characters, got {len(h.node_sn)}"
    return bad, (
        f"Hello: at most {MAX_LABELS} labels, keys of 1..{MAX_LABEL_KEY} and values of at most "
        f"{MAX_LABEL_VALUE} characters, got {len(h.labels)} labels"
    )
