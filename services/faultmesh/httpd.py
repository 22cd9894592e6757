"""The HTTP side of every daemon (aiohttp): ``/metrics``, ``/healthz``, ``/readyz`` plus service routes.

Usage::

    http = HttpServer("127.0.0.1:8080", registry)
    http.app.router.add_get("/v1/faults", handler)   # before start()
    await http.start(); ...; await http.stop()

``ready`` is a callable returning ``(ok, reason)``; ``/readyz`` answers 200 or 503 with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


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


class HttpServer:
    """aiohttp server bound to one address; ``port`` is the bound port after :meth:`start`."""

    def __init__(
        self,
        addr: str,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]] | None = None,
        client_max_size: int = 4 << 20,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.host, self.port = parse_addr(addr)
        self.registry = registry
        self._metrics_body = metrics or (lambda: generate_latest(self.registry))  # a faster body
        self._ready = ready or (lambda: (True, "ok"))
        self.app = web.Application(client_max_size=client_max_size)
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
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
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
