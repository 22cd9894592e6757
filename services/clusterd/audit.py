"""Who did what and why (issue 31): the note an operator action (a release of a separated NPU or an
isolated node, an acknowledgement of a fault) leaves in the fault history's rows and in its log line."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web

from clusterd.store import Store
from faultmesh.model import Fault, now_ms

RELEASE_KEYS = ("released_by", "release_auth", "release_addr", "release_reason")
"""The note's keys of a release: who, how authenticated, from where, why."""
ACK_KEYS = ("acked_by", "ack_auth", "ack_addr", "ack_reason")
"""The note's keys of an acknowledgement (:mod:`clusterd.acks`)."""
MAX_BY, MAX_REASON = 64, 512
OPERATOR = "operator"
"""The source of the history rows an operator action writes itself."""


def bad_request(message: str) -> web.HTTPBadRequest:
    """``400 {"error": message}``."""
    return web.HTTPBadRequest(text=orjson.dumps({"error": message}).decode(), content_type="application/json")


def operator_note(
    request: web.Request, body: dict[str, Any], token_checked: bool, keys: tuple[str, ...] = RELEASE_KEYS
) -> dict[str, str]:
    """Who acted and why, for the history and the log (issue 31), under ``keys`` (default
    :data:`RELEASE_KEYS`: ``released_by`` (the body's ``by``, the operator's name as the CLI sends
    it: claimed, not verified; "operator" when absent), ``release_auth`` (``token``: the request
    carried clusterd's bearer token; ``none``: clusterd runs without one), ``release_addr`` (the
    caller's address) and ``release_reason`` (the body's ``reason``)). Raises
    ``web.HTTPBadRequest`` for a ``by`` or ``reason`` that is not a printable string of at most
    64 / 512 characters."""
    by_key, auth_key, addr_key, reason_key = keys
    out = {by_key: "operator", auth_key: "token" if token_checked else "none", addr_key: request.remote or ""}
    for key, name, most in (("by", by_key, MAX_BY), ("reason", reason_key, MAX_REASON)):
        v = body.get(key)
        if v is None or v == "":
            continue
        if not isinstance(v, str) or len(v) > most or not v.isprintable():
            raise bad_request(f"{key} must be a printable string of at most {most} characters")
        out[name] = v
    return out


def operator_row(
    node: str, device_type: str, device_id: int, code: str, level: str, note: dict[str, str]
) -> Fault:
    """A history row of an operator action on (node, device, code) that no fault change carries (a
    release deviced applies, the breaker's release): source :data:`OPERATOR`, ``note`` as attributes."""
    return Fault(OPERATOR, node, device_type, device_id, code, level, attributes=dict(note))


async def record(store: Store, kind: str, rows: Iterable[Fault]) -> None:
    """Append ``rows`` to the fault history as ``kind`` (``release``, ``ack``, ``unack``) at the
    present time (``GET /v1/events``, ``faultmesh history``). Raises ``sqlite3.Error`` when the
    store refuses them (the HTTP middleware answers 503)."""
    now = now_ms()
    await store.append_events([(now, kind, f) for f in rows])
