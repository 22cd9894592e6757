"""Who did what and why (issue 31): the note an operator action (a release of a separated NPU or an
isolated node, an acknowledgement of a fault) leaves in the fault history's rows and in its log line,
and the one WHY text of a history row (:func:`why_of`) that ``GET /v1/events``, the web node page and
``faultmesh history`` show."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiohttp import web

from clusterd.store import Store
from faultmesh.model import Fault, now_ms

RELEASE_KEYS = ("released_by", "release_auth", "release_addr", "release_reason", "release_token")
"""The note's keys of a release: who (claimed), how authenticated, from where, why, the verified
token's name."""
ACK_KEYS = ("acked_by", "ack_auth", "ack_addr", "ack_reason", "ack_token")
"""The note's keys of an acknowledgement (:mod:`clusterd.acks`)."""
MAX_BY, MAX_REASON = 64, 512
OPERATOR = "operator"
"""The source of the history rows an operator action writes itself."""
TokenName = Callable[[str | None], "str | None"]
"""The verified name of the token an ``Authorization`` header carries, None when none is checked
(:meth:`clusterd.auth.TokenAuth.token_name`)."""
AGENT_OF_SOURCE = {"dcmi": "deviced", "lingqu": "deviced", "nvml": "deviced"}
"""Fault sources whose name is not the agent that reports them."""


def bad_request(message: str) -> web.HTTPBadRequest:
    """``400 {"error": message}``."""
    return web.HTTPBadRequest(text=orjson.dumps({"error": message}).decode(), content_type="application/json")


def operator_note(
    request: web.Request,
    body: dict[str, Any],
    token_name: TokenName | None,
    keys: tuple[str, ...] = RELEASE_KEYS,
    reason_required: bool = False,
) -> dict[str, str]:
    """Who acted and why, for the history and the log (issue 31), under ``keys`` (default
    :data:`RELEASE_KEYS`: ``released_by`` (the body's ``by``, the operator's name as the CLI sends
    it: claimed, not verified; "operator" when absent), ``release_auth`` (``token``: the request
    carried one of clusterd's bearer tokens; ``none``: clusterd runs without one), ``release_addr``
    (the caller's address), ``release_reason`` (the body's ``reason``) and ``release_token`` (the
    verified name of the token, ``token_name`` of the request's header; "" when none is checked)).
    Raises ``web.HTTPBadRequest`` for a ``by`` or ``reason`` that is not a printable string of at
    most 64 / 512 characters, or no ``reason`` when ``reason_required``."""
    by_key, auth_key, addr_key, reason_key, token_key = keys
    name = token_name(request.headers.get("Authorization")) if token_name is not None else None
    out = {
        by_key: "operator",
        auth_key: "none" if name is None else "token",
        addr_key: request.remote or "",
        token_key: name or "",
    }
    for key, name, most in (("by", by_key, MAX_BY), ("reason", reason_key, MAX_REASON)):
        v = body.get(key)
        if v is None or v == "":
            continue
        if not isinstance(v, str) or len(v) > most or not v.isprintable():
            raise bad_request(f"{key} must be a printable string of at most {most} characters")
        out[name] = v
    if reason_required and not out.get(reason_key, "").strip():
        raise bad_request("reason is required: say why (it is kept in the fault history)")
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


def _who(a: dict[str, Any], by: str, token: str) -> str:
    """``alice (token ops-alice)``: the claimed name and the verified token's (``no token``)."""
    how = f"token {a[token]}" if a.get(token) else "no token"
    return f"{a.get(by) or 'operator'} ({how})"


def _ts(ms: int) -> str:
    """``2026-12-06 10:42:00 UTC`` (the server writes the text, so it names its zone), "" for 0."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else ""


def why_of(e: dict[str, Any]) -> str:
    """Why a history row (``{kind, source, attributes, ...}``, as :meth:`clusterd.store.Store.query_events`
    gives it) happened, in words: who acknowledged or released it and why (the claimed name and the
    verified token's, :func:`operator_note`), the rule that raised its level (``upgrade_rule`` and
    how many occurrences it counted), else who reported it (``reported by deviced (dcmi)``)."""
    a = e.get("attributes") or {}
    kind = e.get("kind", "")
    if a.get("acked_by"):
        if kind == "ack":
            who = _who(a, "acked_by", "ack_token")
            return f"acknowledged by {who} until {_ts(int(a.get('ack_until_ms') or 0))}: {a.get('ack_reason', '')}"
        if a.get("ack_ended") == "removed":
            reason = a.get("ended_reason", "")
            return f"acknowledgement removed by {_who(a, 'ended_by', 'ended_token')}" + (
                f": {reason}" if reason else ""
            )
        return f"acknowledgement expired (by {a['acked_by']}: {a.get('ack_reason', '')})"
    if a.get("released_by"):
        reason = a.get("release_reason", "")
        return f"released by {_who(a, 'released_by', 'release_token')}" + (f": {reason}" if reason else "")
    if a.get("upgrade_rule"):
        n = len([t for t in str(a.get("upgrade_occurrences_ms", "")).split(",") if t])
        return a["upgrade_rule"] + (f" ({n} occurrences)" if n else "")
    source = str(e.get("source", ""))
    if not source or source == OPERATOR:
        return ""
    agent, sep, part = source.partition(":")
    reporter = (
        f"{agent} ({part})"
        if sep
        else (f"{AGENT_OF_SOURCE[source]} ({source})" if source in AGENT_OF_SOURCE else source)
    )
    return ("recovery reported by " if kind == "recover" else "reported by ") + reporter


def with_why(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (history rows) each with its ``why`` (:func:`why_of`)."""
    for r in rows:
        r["why"] = why_of(r)
    return rows
