"""Who did what and why (issue 31): the note an operator action (a release of a separated NPU or an
isolated node) leaves in the fault history's rows and in its log line."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


def operator_note(request: web.Request, body: dict[str, Any], token_checked: bool) -> dict[str, str]:
    """Who released what and why, for the history and the log (issue 31): ``released_by`` (the body's
    ``by``, the operator's name as the CLI sends it: claimed, not verified; "operator" when absent),
    ``release_auth`` (``token``: the request carried clusterd's bearer token; ``none``: clusterd runs
    without one), ``release_addr`` (the caller's address) and ``release_reason`` (the body's
    ``reason``). Raises ``web.HTTPBadRequest`` for a ``by`` or ``reason`` that is not a printable
    string of at most 64 / 512 characters."""
    out = {"released_by": "operator", "release_auth": "token" if token_checked else "none",
           "release_addr": request.remote or ""}  # fmt: skip
    for key, name, most in (("by", "released_by", 64), ("reason", "release_reason", 512)):
        v = body.get(key)
        if v is None or v == "":
            continue
        if not isinstance(v, str) or len(v) > most or not v.isprintable():
            raise web.HTTPBadRequest(
                text=orjson.dumps(
                    {"error": f"{key} must be a printable string of at most {most} characters"}
                ).decode(),
                content_type="application/json",
            )
        out[name] = v
    return out
