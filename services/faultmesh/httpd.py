"""ClusterD's HTTP side (aiohttp): ``/metrics``, ``/healthz``, ``/readyz`` plus service routes. The
agents (noded, deviced) use :mod:`faultmesh.httplite`, the same surface without aiohttp.

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

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter

from faultmesh.httplite import (  # shared with the agents' aiohttp-free server
    DENIED,
    OPEN_HTTP_METHODS,
    HttpBase,
    denied_text,
    json_bytes,
    parse_addr,
    rejected_counter,
    token_check,
)
from faultmesh.log import RateLimitedLog

__all__ = [
    "DENIED",
    "OPEN_HTTP_METHODS",
    "HttpServer",
    "bearer_middleware",
    "json_response",
    "parse_addr",
    "rejected_counter",
    "token_check",
]

log = logging.getLogger("faultmesh.http")


def json_response(data, status: int = 200) -> web.Response:
    """A JSON response serialized with orjson (sorted keys for stable output)."""
    return web.Response(body=json_bytes(data), status=status, content_type="application/json")


def found_or_404(body: Any, missing: str) -> web.Response:
    """``body`` as JSON (:func:`json_response`), or ``404 {"error": missing}`` when it is None: the
    answer of a GET of one object that may not exist."""
    return json_response({"error": missing}, status=404) if body is None else json_response(body)


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
        header = request.headers.get("Authorization")
        if request.method not in OPEN_HTTP_METHODS and request.path.startswith(prefix) and not check(header):
            on_deny(request)
            return json_response({"error": denied_text(header)}, status=401)
        return await handler(request)

    return bearer_auth


class _JunkLog:
    """aiohttp's request-handler logger: a request it could not parse (an ``HttpProcessingError``)
    is counted and logged once a minute with the count; a client that closed its connection
    mid-request (``ConnectionResetError``, e.g. during a body) is counted as ``client_gone`` and
    logged the same way, without a traceback; everything else goes to aiohttp's logger."""

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
        if isinstance(exc_info, ConnectionResetError):  # the client left mid-request: nothing to answer
            self._rejected.labels("http", "client_gone").inc()
            self._ratelog.log(
                logging.INFO, "http_client_gone", "http client went away", error=str(exc_info)[:200]
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


class HttpServer(HttpBase):
    """aiohttp server bound to one address (the arguments of :class:`faultmesh.httplite.HttpBase`);
    ``token``: mutating requests need it (:func:`bearer_middleware`)."""

    def __init__(self, addr: str, registry: CollectorRegistry, **kw: Any) -> None:
        super().__init__(addr, registry, **kw)
        self._junk = _JunkLog(self.rejected)
        self.app = web.Application(client_max_size=self.client_max_size)
        if self.token:
            ratelog = RateLimitedLog(log)

            def deny(request: web.Request) -> None:
                self.rejected.labels("http", "unauthenticated").inc()
                ratelog.warning("unauthenticated:http", "request unauthenticated", path=request.path[:200])

            self.app.middlewares.append(bearer_middleware(token_check(self.token), deny))
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
