"""One JSON document in a ConfigMap, the way the HA ConfigMaps keep theirs (issue 15, issue 30).

``binaryData[<key>]`` holds the gzip of the JSON document (base64, as every ``binaryData`` value),
``data["sha256"]`` the hex SHA-256 of the JSON before compression. :func:`pack` makes those fields,
:func:`unpack` checks and reads them. Used by the state mirror (:mod:`clusterd.kube.hastate`,
``state.json.gz``) and the history mirror (:mod:`clusterd.kube.hahistory`, ``history.json.gz``).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import zlib
from typing import Any

import orjson

SUM_KEY = "sha256"
MAX_RAW_BYTES = 64 << 20  # a document that inflates beyond this is rejected (not a gzip bomb)


class StateRejected(ValueError):
    """A ConfigMap document that cannot be trusted; ``reason`` is the stable counted label."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def pack(body: bytes, blob_key: str) -> dict[str, dict[str, str]]:
    """The ConfigMap fields (``data``, ``binaryData``) holding the JSON ``body`` under ``blob_key``."""
    blob = base64.b64encode(gzip.compress(body, compresslevel=1, mtime=0)).decode()
    return {"data": {SUM_KEY: hashlib.sha256(body).hexdigest()}, "binaryData": {blob_key: blob}}


def unpack(cm: dict, blob_key: str) -> Any:
    """The JSON value kept in the ConfigMap ``cm`` under ``blob_key``. Raises :class:`StateRejected`
    (reasons ``missing key``, ``bad encoding`` (not base64 / gzip, or cut short), ``too large`` (more
    than :data:`MAX_RAW_BYTES` inflated), ``checksum mismatch``, ``bad JSON``)."""
    blob = (cm.get("binaryData") or {}).get(blob_key)
    digest = (cm.get("data") or {}).get(SUM_KEY)
    if not isinstance(blob, str) or not isinstance(digest, str):
        raise StateRejected("missing key", f"binaryData.{blob_key} and data.{SUM_KEY} are required")
    try:
        z = zlib.decompressobj(wbits=31)  # gzip
        body = z.decompress(base64.b64decode(blob, validate=True), MAX_RAW_BYTES + 1)
    except (binascii.Error, zlib.error, ValueError) as e:
        raise StateRejected("bad encoding", str(e)) from None
    if len(body) > MAX_RAW_BYTES:
        raise StateRejected("too large", f"more than {MAX_RAW_BYTES} bytes uncompressed")
    if not z.eof:
        raise StateRejected("bad encoding", "the gzip stream is cut short (truncated)")
    if hashlib.sha256(body).hexdigest() != digest.strip():
        raise StateRejected("checksum mismatch", f"{len(body)} bytes (truncated or edited?)")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise StateRejected("bad JSON", str(e)) from None


def retry_reason(status: int) -> str | None:
    """The retry reason of an API error's HTTP status (0: no answer; None: not worth retrying)."""
    if status == 409:
        return "conflict"
    if status == 404:
        return "missing"
    if status == 429:
        return "throttled"
    if status == 0:
        return "timeout"
    if status >= 500:
        return "server"
    return None
