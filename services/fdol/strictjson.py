"""Strict JSON for fdol on the standard library (RFC 8259: ``NaN``/``Infinity`` are not JSON).

fdol imports only the standard library and numpy (issue 12); this is the one JSON decoder its
parsers share, as strict as the orjson it replaces: :func:`loads` raises ``ValueError`` (a
``json.JSONDecodeError``, or ``UnicodeDecodeError`` for bytes that are not UTF-8) on anything else.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps", "loads"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode one JSON document (bytes as UTF-8). Raises ``ValueError`` for invalid JSON, including
    nesting deeper than the interpreter's recursion limit."""
    if not isinstance(data, str):
        data = bytes(data).decode("utf-8")
    try:
        return _DECODER.decode(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (no spaces, non-ASCII kept) as bytes. Raises ``ValueError`` for NaN or
    infinite floats and ``TypeError`` for values JSON cannot hold."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
