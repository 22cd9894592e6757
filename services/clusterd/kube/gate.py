"""Followers refuse (issue 15 HA): a gRPC interceptor and an HTTP middleware that turn clients away
from a clusterd replica that does not hold the leader Lease.

- gRPC: every RPC except ``grpc.health.v1.Health`` and server reflection is answered
  ``UNAVAILABLE`` with ``clusterd follower: not the leader (leader: <holder identity>); retry`` —
  the status gRPC clients (the agents' :class:`faultmesh.agent.AgentClient`, trainsim, the CLI)
  retry with backoff; the agent stream is refused the same way before it is accepted.
- HTTP: a mutating request (not GET/HEAD/OPTIONS) is answered ``503`` with ``{"error": "follower",
  "leader": <holder>}`` and ``Retry-After: 2``; ``/healthz`` and ``/metrics`` still answer;
  ``/readyz`` says ``follower`` with 503, so a Kubernetes Service sends traffic to the leader only.

Each refusal is counted in ``faultmesh_rejected_requests_total{service, reason="follower"}``.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from aiohttp import web

from clusterd.api.refuse import refusing
from clusterd.kube.leader import Election
from faultmesh.httpd import json_response

EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")
READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})
ALWAYS_ANSWER = frozenset({"/healthz", "/readyz", "/metrics"})


class FollowerGate:
    """Refuses clients while ``election`` (the replica's :class:`~clusterd.kube.leader.Election`;
    without an elector, leader election is off: never refuses) does not lead, or always with
    ``always`` (the standby server, which has nothing to serve even in the moment it is elected).
    ``reject(service, reason)`` counts."""

    def __init__(self, election: Election, reject: Callable[[str, str], None], always: bool = False) -> None:
        self._election = election
        self._reject = reject
        self._always = always

    def following(self) -> bool:
        """True while this replica must refuse (leader election on and Lease not held, or always)."""
        return self._always or self._election.following()

    def leader(self) -> str:
        """The Lease holder's identity as last read ("" when unknown or none)."""
        e = self._election.elector
        holder = e.holder if e is not None else ""
        return "" if e is not None and holder == e.identity else holder

    def message(self) -> str:
        """What a refused client is told."""
        return f"clusterd follower: not the leader (leader: {self.leader() or 'unknown'}); retry"

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """The gRPC server interceptor (put it first, before rate limits and auth)."""
        return _Interceptor(self)

    def http_middleware(self):
        """The aiohttp middleware: 503 for mutating requests while following (for every request but
        ``/healthz``, ``/readyz``, ``/metrics`` with ``always``)."""

        @web.middleware
        async def follower_gate(request: web.Request, handler):
            if request.path in ALWAYS_ANSWER or not self.following():
                return await handler(request)
            if request.method in READ_ONLY and not self._always:  # a standby holds nothing to read
                return await handler(request)
            self._reject("http", "follower")
            resp = json_response(
                {"error": "follower", "leader": self.leader(), "message": self.message()}, 503
            )
            resp.headers["Retry-After"] = "2"
            return resp

        return follower_gate

    def ready(self, ready: bool, reason: str) -> tuple[bool, str]:
        """``/readyz`` of a replica: ``(ready, reason)`` unless following (then not ready)."""
        if self.following():
            return False, f"follower (leader: {self.leader() or 'unknown'})"
        return ready, reason


class _Interceptor(grpc.aio.ServerInterceptor):
    def __init__(self, gate: FollowerGate) -> None:
        self.gate = gate

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if not self.gate.following() or method.startswith(EXEMPT):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        self.gate._reject(method.strip("/").split("/")[0] or "grpc", "follower")
        return refusing(handler, grpc.StatusCode.UNAVAILABLE, self.gate.message())
