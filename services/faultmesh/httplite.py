"""The agents' HTTP port without aiohttp (issue 18): ``/metrics``, ``/healthz``, ``/readyz`` and a few
JSON routes over asyncio streams and h11 (python-hyper's HTTP/1.1 state machine).

noded and deviced serve only small GET routes (and deviced's ``/sim`` POSTs with a JSON body), yet
``aiohttp.web`` costs them 11.5 MiB resident, a sixth of an idle agent. This server has the same
surface they use: :class:`HttpServer` with the constructor of :class:`faultmesh.httpd.HttpServer`,
``http.app.router.add_get / add_post / add_route(method, path, handler)``, handlers
``async (Request) -> Response`` and :func:`json_response` (the same bytes as
:func:`faultmesh.httpd.json_response`). ClusterD keeps aiohttp (its streams, middlewares, web UI).

Behaviour kept from the aiohttp server: with ``token`` a request whose method is not
GET/HEAD/OPTIONS needs ``Authorization: Bearer <token>`` (else ``401 {"error": "bearer token
required"}``, counted ``faultmesh_rejected_requests_total{service="http",reason="unauthenticated"}``,
logged once a minute), checked before routing; an unknown path is ``404: Not Found``, a known path
with another method ``405: Method Not Allowed`` (with ``Allow``), a GET route also answers HEAD; a
body over ``client_max_size`` is 413; a request h11 cannot parse is answered 400, counted
``reason="malformed"`` and logged once a minute; a handler that raises is a 500 (logged). HTTP/1.1
keep-alive, idle connections closed after ``KEEPALIVE_S``; :meth:`HttpServer.stop` closes every
connection and ends its task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from faultmesh.config import MAX_BODY_BYTES, check_port
from faultmesh.log import RateLimitedLog
from faultmesh.runtime import wait_for

log = logging.getLogger("faultmesh.http")

OPEN_HTTP_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DENIED = "bearer token required"
WRONG_TOKEN = "bearer token does not match"


def denied_text(header: str | None) -> str:
    """The refusal of a request whose ``Authorization`` header (None: absent) failed the check: no
    token -> :data:`DENIED`, a token that is not the one -> :data:`WRONG_TOKEN` (never echoed)."""
    return WRONG_TOKEN if header else DENIED


KEEPALIVE_S = 75.0  # aiohttp's default keep-alive
READ_CHUNK = 65536
_JSON_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
_REASONS = {int(s): s.phrase.encode() for s in HTTPStatus}


def parse_addr(addr: str, default_port: int = 0) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` -> ``("127.0.0.1", 8080)``; ``"[::1]:80"`` works; port 0 (listen on any
    free port) too. Raises ``ValueError`` naming ``addr`` for a port that is not a number or not in
    0..65535 (:func:`faultmesh.config.check_port`; the socket layer would refuse it later, or wrap it)."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        return addr, default_port
    host = host.strip("[]")
    try:
        n = check_port(port)
    except ValueError as e:
        raise ValueError(f"bad address {addr[:64]!r}: {e}") from None
    return host or "127.0.0.1", n


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


def json_bytes(data: Any) -> bytes:
    """``data`` as the daemons' JSON bodies write it (orjson, sorted keys)."""
    return orjson.dumps(data, option=_JSON_OPTS)


class Response:
    """``body`` (bytes), ``status``, ``content_type`` and extra ``headers`` of one answer; ``text``
    (str) instead of ``body`` is sent as ``text/plain; charset=utf-8``."""

    def __init__(
        self,
        *,
        body: bytes = b"",
        text: str | None = None,
        status: int = 200,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.headers = dict(headers or {})
        if text is not None:
            body = text.encode()
            content_type = content_type or "text/plain"
            content_type += "; charset=utf-8"
        self.body = body
        self.status = status
        if content_type and "Content-Type" not in self.headers:
            self.headers["Content-Type"] = content_type


def json_response(data: Any, status: int = 200) -> Response:
    """A JSON response serialized with orjson (sorted keys for stable output)."""
    return Response(body=json_bytes(data), status=status, content_type="application/json")


class Request:
    """One request: ``method``, ``path``, ``query`` (name -> first value), ``headers`` (lower-case
    names -> value), the body through :meth:`read` / :meth:`text` / :meth:`json`."""

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        url = urlsplit(target)
        self.path = url.path or "/"
        self.query: dict[str, str] = {}
        for k, v in parse_qsl(url.query, keep_blank_values=True):
            self.query.setdefault(k, v)
        self.headers = headers
        self._body = body

    async def read(self) -> bytes:
        """The body."""
        return self._body

    async def text(self) -> str:
        """The body as UTF-8 text (undecodable bytes replaced)."""
        return self._body.decode(errors="replace")

    async def json(self) -> Any:
        """The body decoded as JSON. Raises ``ValueError`` when it is not JSON (also when empty)."""
        return orjson.loads(self._body)


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """Exact-path routes: ``add_get`` (also HEAD), ``add_post``, ``add_route(method, path, handler)``."""

    def __init__(self) -> None:
        self.routes: dict[str, dict[str, Handler]] = {}  # path -> method -> handler

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """Route ``method`` on ``path`` to ``handler``. Raises ``ValueError`` for a second one."""
        methods = self.routes.setdefault(path, {})
        method = method.upper()
        if method in methods:
            raise ValueError(f"{method} {path} already has a handler")
        methods[method] = handler

    def add_get(self, path: str, handler: Handler) -> None:
        """GET (and HEAD) on ``path``."""
        self.add_route("GET", path, handler)
        self.routes[path].setdefault("HEAD", handler)

    def add_post(self, path: str, handler: Handler) -> None:
        """POST on ``path``."""
        self.add_route("POST", path, handler)


class App:
    """What the routes are added to: ``app.router`` (the shape of ``aiohttp.web.Application``'s)."""

    def __init__(self) -> None:
        self.router = Router()


def _plain(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    return Response(text=text, status=status, headers=headers)


class HttpBase:
    """What both HTTP servers take (this one and :class:`faultmesh.httpd.HttpServer`): ``addr``
    (``host:port``; ``port`` is the bound one after ``start()``), ``registry``, ``ready``: ``() ->
    (ok, reason)`` for ``/readyz`` (200 or 503 with the reason); ``client_max_size``: the largest
    body (bytes); ``token``: mutating requests need it (None: open); ``rejected``: the
    ``faultmesh_rejected_requests_total`` counter (default: made on ``registry``); ``metrics``:
    ``() -> bytes``, the ``/metrics`` body (default ``generate_latest(registry)``)."""

    def __init__(
        self,
        addr: str,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]] | None = None,
        client_max_size: int = MAX_BODY_BYTES,
        token: str | None = None,
        rejected: Counter | None = None,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.host, self.port = parse_addr(addr)
        self.registry = registry
        self.client_max_size = client_max_size
        self.token = token
        self._metrics_body = metrics or (lambda: generate_latest(self.registry))  # or a faster body
        self._ready = ready or (lambda: (True, "ok"))
        self.rejected = rejected if rejected is not None else rejected_counter(registry)


class HttpServer(HttpBase):
    """The agents' HTTP server (the arguments of :class:`HttpBase`); routes on ``app.router``."""

    def __init__(self, addr: str, registry: CollectorRegistry, **kw: Any) -> None:
        super().__init__(addr, registry, **kw)
        self._check = token_check(self.token) if self.token else None
        self._ratelog = RateLimitedLog(log)
        self.app = App()
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def _metrics(self, request: Request) -> Response:
        return Response(body=self._metrics_body(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: Request) -> Response:
        return Response(text="ok\n")

    async def _readyz(self, request: Request) -> Response:
        ok, reason = self._ready()
        return Response(text=reason + "\n", status=200 if ok else 503)

    async def start(self) -> None:
        """Bind and serve. Raises ``OSError`` when the address is taken."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)
        sockets = self._server.sockets or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop serving and close every open connection (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._conns.values()):
            writer.close()  # the connection's read sees the end: its task returns
        if self._conns:
            _, late = await asyncio.wait(list(self._conns), timeout=2.0)
            for task in late:
                task.cancel()
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await wait_for(server.wait_closed(), 2.0)

    # -- one connection ------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                try:
                    got = await self._read_request(conn, reader, writer)
                except h11.RemoteProtocolError as e:
                    self._malformed(e)
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await self._send(
                            conn, writer, _plain(400, "400: Bad Request"), head=False, close=True
                        )
                    return
                if got is None:
                    return
                if isinstance(got, Response):  # refused while reading (413)
                    await self._send(conn, writer, got, head=False, close=True)
                    return
                req = got
                resp = await self._respond(req)
                await self._send(conn, writer, resp, head=req.method == "HEAD", close=False)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return  # one side asked to close (Connection: close, HTTP/1.0)
                conn.start_next_cycle()
        except (ConnectionError, TimeoutError, h11.LocalProtocolError):
            pass
        finally:
            self._conns.pop(task, None)
            writer.close()

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            ev = conn.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            conn.receive_data(await wait_for(reader.read(READ_CHUNK), KEEPALIVE_S))

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Request | Response | None:
        ev = await self._next(conn, reader)
        if isinstance(ev, h11.ConnectionClosed):
            return None
        if not isinstance(ev, h11.Request):
            raise h11.RemoteProtocolError(f"expected a request, got {type(ev).__name__}")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in ev.headers}
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.client_max_size:
            return self._too_large(int(length))
        if conn.they_are_waiting_for_100_continue:  # curl's Expect: 100-continue for a larger body
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = bytearray()
        while True:
            part = await self._next(conn, reader)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > self.client_max_size:
                    return self._too_large(len(body))
            elif isinstance(part, h11.EndOfMessage):
                break
            elif isinstance(part, h11.ConnectionClosed):
                return None
        return Request(ev.method.decode("ascii"), ev.target.decode("latin-1"), headers, bytes(body))

    def _too_large(self, size: int) -> Response:
        return _plain(
            413, f"Maximum request body size {self.client_max_size} exceeded, actual body size {size}"
        )

    async def _respond(self, req: Request) -> Response:
        if req.method not in OPEN_HTTP_METHODS and self._check is not None:
            header = req.headers.get("authorization")
            if not self._check(header):
                self.rejected.labels("http", "unauthenticated").inc()
                self._ratelog.warning("unauthenticated:http", "request unauthenticated", path=req.path[:200])
                return json_response({"error": denied_text(header)}, status=401)
        methods = self.app.router.routes.get(req.path)
        if methods is None:
            return _plain(404, "404: Not Found")
        handler = methods.get(req.method)
        if handler is None:
            return _plain(405, "405: Method Not Allowed", {"Allow": ",".join(sorted(methods))})
        try:
            return await handler(req)
        except Exception:
            log.exception("Error handling request")  # what aiohttp logs; the client gets a 500
            return _plain(500, "500 Internal Server Error\n\nServer got itself in trouble")

    async def _send(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, resp: Response, head: bool, close: bool
    ) -> None:
        headers = [(k, v) for k, v in resp.headers.items() if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(resp.body))))
        if close:
            headers.append(("Connection", "close"))
        reason = _REASONS.get(resp.status, b"")
        out = conn.send(h11.Response(status_code=resp.status, headers=headers, reason=reason)) or b""
        if resp.body and not head:
            out += conn.send(h11.Data(data=resp.body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        writer.write(out)
        await wait_for(writer.drain(), KEEPALIVE_S)  # a client that stops reading: the connection ends

    def _malformed(self, e: Exception) -> None:
        self.rejected.labels("http", "malformed").inc()
        self._ratelog.warning(
            "http_malformed",
            "http request malformed",
            error=" ".join(f"{type(e).__name__}: {e}".split())[:200],
        )
