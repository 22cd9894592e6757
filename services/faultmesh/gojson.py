"""Go-compatible JSON for the reference's CheckCode (reference noded.md §4, deviced.md §5.1, clusterd.md §6.1).

The reference agents put ``CheckCode = hex(sha256(json.Marshal(inner struct)))`` next to the inner
struct; ClusterD unmarshals the struct, marshals it again and drops the ConfigMap on a mismatch. To
verify and to produce such codes faultmesh must emit the bytes Go emits:

- compact (no spaces), struct fields in declaration order, map keys sorted;
- ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\u003c`` ... (Go's HTML-safe default);
- non-ASCII as raw UTF-8; nil slices and maps as ``null``, empty ones as ``[]`` / ``{}``.

The canonical shapes below re-create Go's unmarshal -> marshal round trip: unknown fields dropped,
missing ones zero (``""``, ``0``, ``null``), field names matched exactly or else case-insensitively,
and a value of the wrong JSON type is an error (:class:`GoTypeError`), as ``json.Unmarshal`` fails.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_TRANS = str.maketrans(_ESCAPES)


class GoTypeError(ValueError):
    """A JSON value whose type Go's ``json.Unmarshal`` would refuse for the struct field."""


def marshal(obj: Any) -> bytes:
    """Compact JSON as Go's ``json.Marshal`` writes it. ``obj`` must already be in Go field order
    (use the ``canon_*`` helpers); dict keys of Go *maps* must be sorted by the caller."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_TRANS).encode("utf-8")


def check_code(obj: Any) -> str:
    """Lowercase hex SHA-256 of :func:`marshal` of ``obj``."""
    return hashlib.sha256(marshal(obj)).hexdigest()


def _field(d: dict, name: str) -> Any:
    if name in d:
        return d[name]
    low = name.lower()
    for k, v in d.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def _str(v: Any, where: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise GoTypeError(f"{where}: want string, got {type(v).__name__}")
    return v


def _int(v: Any, where: str) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise GoTypeError(f"{where}: want integer, got {v!r}")
    if not -(1 << 63) <= v < (1 << 63):
        raise GoTypeError(f"{where}: {v} overflows int64")
    return v


def _obj(v: Any, where: str) -> dict | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise GoTypeError(f"{where}: want object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise GoTypeError(f"{where}: want array, got {type(v).__name__}")
    return v


def canon_node_info(v: Any) -> dict:
    """NodeD's ``FaultDevInfo{FaultDevList []FaultDev; NodeStatus string}`` with
    ``FaultDev{DeviceType string; DeviceId int64; FaultCode []string; FaultLevel string}``."""
    d = _obj(v, "NodeInfo") or {}
    devs = _list(_field(d, "FaultDevList"), "FaultDevList")
    out_devs = None
    if devs is not None:
        out_devs = []
        for i, dev in enumerate(devs):
            dd = _obj(dev, f"FaultDevList[{i}]") or {}
            codes = _list(_field(dd, "FaultCode"), f"FaultDevList[{i}].FaultCode")
            out_devs.append(
                {
                    "DeviceType": _str(_field(dd, "DeviceType"), f"FaultDevList[{i}].DeviceType"),
                    "DeviceId": _int(_field(dd, "DeviceId"), f"FaultDevList[{i}].DeviceId"),
                    "FaultCode": None
                    if codes is None
                    else [_str(c, f"FaultDevList[{i}].FaultCode") for c in codes],
                    "FaultLevel": _str(_field(dd, "FaultLevel"), f"FaultDevList[{i}].FaultLevel"),
                }
            )
    return {"FaultDevList": out_devs, "NodeStatus": _str(_field(d, "NodeStatus"), "NodeStatus")}


def canon_device_info(v: Any) -> dict:
    """The device plugin's ``DeviceInfo{DeviceList map[string]string; UpdateTime int64}``."""
    d = _obj(v, "DeviceInfo") or {}
    dl = _obj(_field(d, "DeviceList"), "DeviceList")
    out = None
    if dl is not None:
        out = {k: _str(dl[k], f"DeviceList[{k}]") for k in sorted(dl)}
    return {"DeviceList": out, "UpdateTime": _int(_field(d, "UpdateTime"), "UpdateTime")}
