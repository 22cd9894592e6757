"""The HTTP side of every daemon (aiohttp): ``/metrics``, ``/healthz``, ``/readyz`` plus service routes.

Usage::

    http = HttpServer("127.0.0.1:8080", registry)
    http.app.router.add_get("/v1/faults", handler)   # before start()
    await http.start(); ...; await http.stop()

``ready`` is a callable returning ``(ok, reason)``; ``/readyz`` answers 200 or 503 with the reason.

Bearer token (issue 19 #7): with ``token`` every mutating request (any method but GET/HEAD/OPTIONS)
needs ``Authorization: Bearer <token>`` (:func:`bearer_middleware`, the one HTTP token check of every
daemon; ClusterD's :class:`clusterd.auth.TokenAuth` builds on it), else ``401 {"error": "bearer token
required"}``. Junk (issue 19 #9): a request aiohttp cannot parse is answered 400 by aiohttp, counted in
``faultmesh_rejected_requests_total{service="http",reason="malformed"}`` and logged once a minute
with the count (aiohttp logs a traceback per request otherwise).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from faultmesh.log import RateLimitedLog

log = logging.getLogger("faultmesh.http")

OPEN_HTTP_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DENIED = "bearer token required"


def parse_addr(addr: str, default_port: int = 0) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` -> ``("127.0.0.1", 8080)``; ``"[::1]:80"`` works. Raises ``ValueError``."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, default_port
    host = host.strip("[]")
    return host or "127.0.0.1", int(port)


def json_response(data, status: int = 200) -> web.Response:
    """A JSON response serialized with orjson (sorted keys for stable output)."""
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS),
        status=status,
        content_type="application/json",
    )


def bearer_middleware(
    check: Callable[[str | None], bool],
    on_deny: Callable[[web.Request], None] = lambda request: None,
    prefix: str = "/",
):
    """An aiohttp middleware: a request under ``prefix`` whose method is not GET/HEAD/OPTIONS and
    whose ``Authorization`` header fails ``check`` gets ``401 {"error": "bearer token required"}``
    after ``on_deny(request)`` (count and log it there)."""

    @web.middleware
    async def bearer_auth(request: web.Request, handler) -> web.StreamResponse:
        if (
            request.method not in OPEN_HTTP_METHODS
            and request.path.startswith(prefix)
            and not check(request.headers.get("Authorization"))
        ):
            on_deny(request)
            return json_response({"error": DENIED}, status=401)
        return await handler(request)

    return bearer_auth


def token_check(token: str) -> Callable[[str | None], bool]:
    """``check(header)``: True when ``header`` is exactly ``Bearer <token>`` (constant-time)."""
    expect = f"Bearer {token}"
    return lambda header: header is not None and hmac.compare_digest(header, expect)


def rejected_counter(registry: CollectorRegistry) -> Counter:
    """``faultmesh_rejected_requests_total{service,reason}`` on ``registry`` (the daemons' one name)."""
    return Counter(
        "faultmesh_rejected_requests_total",
        "Rejected requests by service and reason",
        ["service", "reason"],
        registry=registry,
    )


class _JunkLog:
    """aiohttp's request-handler logger: a request it could not parse (an ``HttpProcessingError``)
    is counted and logged once a minute with the count; everything else goes to aiohttp's logger."""

    def __init__(self, rejected: Counter) -> None:
        self._rejected = rejected
        self._ratelog = RateLimitedLog(log)
        self._inner = logging.getLogger("aiohttp.server")

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._rejected.labels("http", "malformed").inc()
            self._ratelog.warning(
                "http_malformed",
                "http request malformed",
                error=" ".join(f"{type(exc_info).__name__}: {exc_info}".split())[:200],
            )
            return
        self._inner.exception(msg, *args, exc_info=exc_info, **kw)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):  # a non-HTTP first line: aiohttp's debug case
            self._rejected.labels("http", "malformed").inc()
            return
        self._inner.debug(msg, *args, exc_info=exc_info, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class HttpServer:
    """aiohttp server bound to one address; ``port`` is the bound port after :meth:`start`.

    ``token``: mutating requests need it (:func:`bearer_middleware`; None: open); ``rejected``: the
    ``faultmesh_rejected_requests_total`` counter to count refusals in (default: made on ``registry``).
    """

    def __init__(
        self,
        addr: str,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]] | None = None,
        client_max_size: int = 4 << 20,
        token: str | None = None,
        rejected: Counter | None = None,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.host, self.port = parse_addr(addr)
        self.registry = registry
        self._metrics_body = metrics or (lambda: generate_latest(self.registry))  # a faster body
        self._ready = ready or (lambda: (True, "ok"))
        self.rejected = rejected if rejected is not None else rejected_counter(registry)
        self._junk = _JunkLog(self.rejected)
        self.app = web.Application(client_max_size=client_max_size)
        if token:
            ratelog = RateLimitedLog(log)

            def deny(request: web.Request) -> None:
                self.rejected.labels("http", "unauthenticated").inc()
                ratelog.warning("unauthenticated:http", "request unauthenticated", path=request.path[:200])

            self.app.middlewares.append(bearer_middleware(token_check(token), deny))
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self._metrics_body()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, reason = self._ready()
        return web.Response(text=reason + "\n", status=200 if ok else 503)

    async def start(self) -> None:
        """Bind and serve. Raises ``OSError`` when the address is taken."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, logger=self._junk)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
