"""``GET /v1/events``: the fault history (:mod:`clusterd.history`), read-only.

Query: ``node``, ``code`` (exact), ``since`` (see :func:`parse_since`; default: everything kept),
``limit`` (the newest N, default 1000, at most 100000). Answers a JSON list, oldest first, of
``{ts_ms, kind, node, device_type, device_id, code, source, level, assertion, attributes}``;
a bad ``since`` or ``limit`` is 400 with ``{"error": ...}``.
"""

from __future__ import annotations

import re
from datetime import datetime

from aiohttp import web

from clusterd.store import Store
from faultmesh.httpd import json_response
from faultmesh.model import now_ms

MAX_LIMIT = 100_000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


MAX_MS = 2**63 - 1  # SQLite's integer range


def parse_since(text: str, now: int | None = None) -> int:
    """``since`` as ms since the epoch. Accepts a duration back from now (``90s``, ``30m``, ``12h``,
    ``2d``, ``1w``), an ISO 8601 / RFC 3339 time (``2026-12-01T08:00:00+00:00``; no offset = local
    time), or ms since the epoch. Raises ``ValueError`` with the accepted forms."""
    text = text.strip()
    now = now_ms() if now is None else now
    try:
        m = _AGO.match(text)
        if m:
            v = now - int(float(m.group(1)) * _UNITS[m.group(2)] * 1000)
        elif text.isdigit():
            v = int(text)
        else:
            v = int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except (ValueError, OverflowError):
        raise ValueError(
            f"since {text[:64]!r}: use a duration (30m, 12h, 2d), an RFC 3339 time or ms since the epoch"
        ) from None
    if v > MAX_MS:
        raise ValueError(f"since {text[:64]!r} is out of range (at most {MAX_MS} ms since the epoch)")
    return max(0, v)  # before the epoch: everything kept


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
        return json_response(rows)
