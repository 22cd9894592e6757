"""ClusterD's one bearer-token check, for HTTP and gRPC (issue 12).

With ``--token-file`` every mutating call must carry ``authorization: Bearer <token>``; without it
nothing is checked. Two enforcement points, both built from one :class:`TokenAuth`:

- :meth:`TokenAuth.http_middleware`: the core's :func:`faultmesh.httpd.bearer_middleware` (the one
  HTTP token check of every daemon); every request whose method is not GET/HEAD/OPTIONS needs the
  header, else ``401 {"error": "bearer token required"}``, counted in
  ``faultmesh_rejected_requests_total{service="http",reason="unauthenticated"}``.
- :class:`TokenInterceptor`: a gRPC server interceptor; the methods of :data:`PROTECTED` (agent
  stream, PubFault, every Recover RPC but HealthCheck, ModifyTrainingDataTraceSwitch, and the
  Register and Subscribe RPCs of job.Job, fault.Fault and config.Config: a registration is server
  state, and a token-less Register must not end an authenticated subscriber's stream, issue 19 #8)
  need the metadata, else status ``UNAUTHENTICATED`` ``bearer token required``, counted with the
  service label of that table. Read-only queries (GetFaultMsgSignal, HealthCheck, ...) are open, as
  in the reference. With ``--token-scope agents`` only the agent stream and PubFault need it
  (:data:`AGENT_SCOPE`): the reference's job-side clients (TaskD, MindIO, Elastic Agent, AI platforms)
  send no token, so a deployment that must serve them unchanged guards the rest by network policy
  (the chart's default, docs/deploy.md).

Named tokens (issue 31): the token file holds either one token (the plain format, named
``default``) or, on two or more lines, ``name:token`` per line (``#`` starts a comment line), so an
operator action (a release, an acknowledgement) records the verified name of the token it carried
(:meth:`TokenAuth.token_name`), not only the ``--by`` the caller claims. Every named token is
accepted wherever the token is required: the agents keep sending the one they share.

The refusal is decided here, before the method runs: a refused call is answered with its status
alone (trailers-only, nothing read). For the agent stream that is the whole of telling a refusal
from an acceptance: an accepted stream sends its response headers first
(:meth:`clusterd.ingest.agents.AgentHub.Connect`) and the agent writes only after them
(:func:`faultmesh.agent.open_stream`); a client that writes before them can be told INTERNAL
"Internal error from Core" by grpcio instead of UNAUTHENTICATED (its failed write wins, issue 35).
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Iterable

import grpc
from prometheus_client import Counter

from clusterd.api.refuse import refusing
from faultmesh.config import BadSecretFile, read_secret
from faultmesh.httpd import DENIED, OPEN_HTTP_METHODS, bearer_middleware  # noqa: F401 - re-exported
from faultmesh.httplite import denied_text
from faultmesh.log import RateLimitedLog

log = logging.getLogger("clusterd.auth")

RECOVER_OPEN = ("HealthCheck",)
RECOVER_METHODS = (
    "Init", "Register", "SubscribeProcessManageSignal", "ReportStopComplete", "ReportRecoverStrategy",
    "ReportRecoverStatus", "ReportProcessFault", "SwitchNicTrack", "SubscribeSwitchNicSignal",
    "SubscribeNotifySwitch", "ReplySwitchNicResult", "StressTest", "SubscribeStressTestResponse",
    "SubscribeNotifyExecStressTest", "ReplyStressTestResult",
)  # fmt: skip
SUBSCRIPTION_METHODS = (
    "job.Job/Register", "job.Job/SubscribeJobSummarySignal", "job.Job/SubscribeJobSummarySignalList",
    "fault.Fault/Register", "fault.Fault/SubscribeFaultMsgSignal",
    "config.Config/Register", "config.Config/SubscribeRankTable",
)  # fmt: skip
PROTECTED: dict[str, str] = {
    "/faultmesh.v1.AgentStream/Connect": "agent",
    "/PubFault/SendPublicFault": "pubfault",
    "/TrainingDataTrace/ModifyTrainingDataTraceSwitch": "brain",
    **{f"/Recover/{m}": "brain" for m in RECOVER_METHODS},
    **{f"/{m}": "brain" for m in SUBSCRIPTION_METHODS},
}
"""gRPC method path -> service label of the rejected-requests counter."""
AGENT_SCOPE: dict[str, str] = {m: svc for m, svc in PROTECTED.items() if svc in ("agent", "pubfault")}
"""``--token-scope agents``: only the agent stream and PubFault need the token (the reference's TaskD,
MindIO, Elastic Agent and platform clients send none); HTTP writes always do."""
SCOPES = {"all": PROTECTED, "agents": AGENT_SCOPE}
DEFAULT_NAME = "default"
"""The name of the token of a one-token file (the plain format)."""
TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def parse_tokens(text: str, where: str = "--token-file") -> dict[str, str]:
    """The tokens of a token file's ``text``: ``{name: token}``. One line (blank lines and ``#``
    comment lines aside) is the plain format, the whole line the token, named :data:`DEFAULT_NAME`;
    two or more lines are ``name:token`` each (a name of at most 64 letters, digits, ``._@-``).
    Raises :class:`faultmesh.config.BadSecretFile` (naming ``where`` and the line, never the token)
    for no token, a line that is not ``name:token``, a repeated name or token."""
    lines = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)]
    lines = [(i, ln) for i, ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise BadSecretFile(f"{where} holds no token")
    if len(lines) == 1:
        return {DEFAULT_NAME: lines[0][1]}
    out: dict[str, str] = {}
    for i, ln in lines:
        name, sep, tok = ln.partition(":")
        name, tok = name.strip(), tok.strip()
        if not sep or not tok or not TOKEN_NAME.fullmatch(name):
            raise BadSecretFile(f"{where} line {i}: expected name:token (a name of letters, digits, ._@-)")
        if name in out or tok in out.values():
            raise BadSecretFile(f"{where} line {i}: the name or the token of {name!r} is given twice")
        out[name] = tok
    return out


class TokenAuth:
    """The configured token (None: open). ``rejected`` is ``faultmesh_rejected_requests_total``."""

    def __init__(self, token: str | dict[str, str] | None, rejected: Counter, scope: str = "all") -> None:
        """``token``: one token (named :data:`DEFAULT_NAME`), ``{name: token}`` (:func:`parse_tokens`)
        or None (open). ``scope``: which gRPC methods need the token (:data:`SCOPES`: ``all`` =
        :data:`PROTECTED`, ``agents`` = :data:`AGENT_SCOPE`). Raises ``KeyError`` for another scope."""
        tokens = {DEFAULT_NAME: token} if isinstance(token, str) else dict(token or {})
        self._expect = [(name, f"Bearer {tok}".encode()) for name, tok in tokens.items() if tok] or None
        self.rejected = rejected
        self.protected = SCOPES[scope]
        self._ratelog = RateLimitedLog(log)

    @classmethod
    def from_file(cls, path: str | None, rejected: Counter, scope: str = "all") -> TokenAuth:
        """Read ``--token-file`` (None or "" -> open; :func:`parse_tokens`). Raises ``OSError``
        (:class:`faultmesh.config.BadSecretFile`) when unreadable, empty or malformed."""
        text = read_secret(path, what="--token-file") if path else None
        return cls(parse_tokens(text, f"--token-file {path}") if text else None, rejected, scope)

    @property
    def names(self) -> list[str]:
        """The names of the configured tokens (none when open)."""
        return [name for name, _ in self._expect or ()]

    @property
    def enabled(self) -> bool:
        """True when a token is configured."""
        return self._expect is not None

    def token_name(self, header: str | None) -> str | None:
        """The name of the token ``header`` (``Bearer <token>``) carries, or None (open, no header, no
        such token). Compared in constant time with every configured token."""
        if self._expect is None or header is None:
            return None
        raw, found = header.encode(errors="surrogateescape"), None
        for name, want in self._expect:  # no early exit: the time does not tell which one matched
            if hmac.compare_digest(raw, want) and found is None:
                found = name
        return found

    def check(self, header: str | None) -> bool:
        """True when open, or ``header`` is exactly ``Bearer <token>`` of one configured token."""
        return self._expect is None or self.token_name(header) is not None

    def check_metadata(self, metadata: Iterable[tuple[str, str]] | None) -> bool:
        """:meth:`check` on the ``authorization`` entry of gRPC invocation metadata."""
        if self._expect is None:
            return True
        return any(k == "authorization" and self.check(v) for k, v in metadata or ())

    def deny(self, service: str, **fields) -> None:
        """Count and (rate-limited) log one unauthenticated call."""
        self.rejected.labels(service, "unauthenticated").inc()
        self._ratelog.warning(
            f"unauthenticated:{service}", "request unauthenticated", service=service, **fields
        )

    def http_middleware(self):
        """The aiohttp middleware (see the module docstring)."""
        return bearer_middleware(self.check, lambda request: self.deny("http", path=request.path[:200]))

    def interceptor(self) -> TokenInterceptor:
        """The gRPC server interceptor of this token."""
        return TokenInterceptor(self, self.protected)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls of :data:`PROTECTED` methods without the token (see the module docstring)."""

    def __init__(self, auth: TokenAuth, protected: dict[str, str] | None = None) -> None:
        self._auth = auth
        self._protected = PROTECTED if protected is None else protected

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        service = self._protected.get(method)
        if (
            handler is None
            or service is None
            or self._auth.check_metadata(handler_call_details.invocation_metadata)
        ):
            return handler
        auth = self._auth
        header = next(
            (v for k, v in handler_call_details.invocation_metadata or () if k == "authorization"), None
        )
        return refusing(
            handler,
            grpc.StatusCode.UNAUTHENTICATED,
            denied_text(header),
            lambda context: auth.deny(service, method=method, peer=context.peer()),
        )
