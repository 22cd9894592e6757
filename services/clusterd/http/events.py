"""``GET /v1/events``: the fault history (:mod:`clusterd.history`), read-only.

Query: ``node``, ``code`` (exact), ``since`` (see :func:`faultmesh.config.parse_since`; default: everything kept),
``limit`` (the newest N, default 1000, at most 100000). Answers a JSON list, oldest first, of
``{ts_ms, kind, node, device_type, device_id, code, source, level, assertion, attributes, why}``
(``why``: the change's reason in words, :func:`clusterd.audit.why_of`);
a bad ``since`` or ``limit`` is 400 with ``{"error": ...}``.
"""

from __future__ import annotations

from aiohttp import web

from clusterd.audit import with_why
from clusterd.store import Store
from faultmesh.config import parse_since
from faultmesh.httpd import json_response

MAX_LIMIT = 100_000


class EventsApi:
    """The ``/v1/events`` route over the store's fault history."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register ``GET /v1/events``."""
        router.add_get("/v1/events", self.events)

    async def events(self, request: web.Request) -> web.Response:
        q = request.query
        try:
            since = parse_since(q["since"]) if q.get("since") else 0
            text = q.get("limit", "1000")
            limit = int(text) if text.strip().isdigit() else 0
            if not 0 < limit <= MAX_LIMIT:
                raise ValueError(f"limit must be an integer 1..{MAX_LIMIT}, got {text[:40]!r}")
        except ValueError as e:
            return json_response({"error": str(e)}, status=400)
        rows = await self.store.query_events(q.get("node") or None, q.get("code") or None, since, limit)
        return json_response(with_why(rows))
