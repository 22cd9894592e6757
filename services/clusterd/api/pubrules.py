"""PubFault's pure part: the public fault table (:class:`PublicFaultTable`), the request and fault
rules in the reference's order and wording (:func:`validate_request`, :func:`validate_fault`,
reference clusterd.md §5) and the cache caps (:func:`over_cap`, judged by the fault center's writer).
No I/O but reading a table file; :mod:`clusterd.api.pubfault` applies what these accept.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from clusterd.faultindex import FaultIndex
from faultmesh._pb import pubfault_pb2
from faultmesh.faultrules import unknown_key
from faultmesh.model import RECOVER, FaultKey

DEFAULT_TABLE = Path(__file__).parent.parent / "tables" / "publicFaultConfiguration.json"
ID_RE = re.compile(r"^[a-zA-Z0-9\-_.]{8,128}$")
DESC_RE = re.compile(r"^[\S ]{0,512}$")
NODE_RE = re.compile(r"^[a-z0-9]([a-z0-9\-.]{0,251}[a-z0-9])?$")
MIN_TIME_MS = 1735689600000  # 2025-01-01T00:00:00Z
FAULT_TYPES = ("NPU", "Node", "Network", "Storage")
ASSERTIONS = ("occur", "recover", "once")
MAX_ITEMS = 50_000  # reference cache cap: one item per (node, resource + faultId)
MAX_RECORDS = 50_000  # faultmesh: one record per device id; bounded too (memory, event-loop time)
LEVEL_KEYS = (  # lookup precedence: Separate > PreSeparate > SubHealth > NotHandle
    ("SeparateNPUCodes", "SeparateNPU"),
    ("PreSeparateNPUCodes", "PreSeparateNPU"),
    ("SubHealthFaultCodes", "SubHealthFault"),
    ("NotHandleFaultCodes", "NotHandleFault"),
)


class TableError(ValueError):
    """A public fault table that cannot be used (the message says why)."""


MAX_TABLE_BYTES = 4 * 1024 * 1024  # as deviced's and noded's tables; the reference's default is < 1 KiB
TOP_KEYS = ("publicFaultCode", "publicFaultResource")
CODE_RE = re.compile(r"^[0-9]{9}$")  # reference §5: 9 digits (type, level, "00", origin, number)


def _check_keys(obj: dict, known: tuple[str, ...], where: str) -> None:
    """Refuse a table with a key outside ``known`` (:func:`faultmesh.faultrules.unknown_key`)."""
    if bad := unknown_key(obj, known, where):
        raise TableError(bad)


class PublicFaultTable:
    """The public fault table in the reference's publicFaultConfiguration.json format
    (clusterd.md §5 "Configuration").

    ``levels``: code -> level name; ``resources``: allowed senders. A key outside the reference's
    schema (top level ``publicFaultCode`` / ``publicFaultResource``; level lists
    ``NotHandleFaultCodes``, ``SubHealthFaultCodes``, ``SeparateNPUCodes``, ``PreSeparateNPUCodes``),
    a level list that is not a list (null is empty), a code that is not 9 digits or an empty resource
    refuses the whole table: raises :class:`TableError` naming the key and why.
    """

    def __init__(self, data: dict[str, Any], where: str = "<table>") -> None:
        if not isinstance(data, dict):
            raise TableError(f"{where}: table must be a JSON object")
        _check_keys(data, TOP_KEYS, where)
        codes = data.get("publicFaultCode")
        resources = data.get("publicFaultResource")
        if not isinstance(codes, dict) or not isinstance(resources, list):
            raise TableError(f"{where}: publicFaultCode (object) and publicFaultResource (list) are required")
        _check_keys(codes, tuple(k for k, _ in LEVEL_KEYS), f"{where}: publicFaultCode")
        self.levels: dict[str, str] = {}
        for key, level in reversed(LEVEL_KEYS):  # later (more severe) lists win
            items = codes.get(key)
            if items is None:
                items = []
            if not isinstance(items, list):
                raise TableError(f"{where}: {key} must be a list of code strings, not {type(items).__name__}")
            for c in items:
                if not isinstance(c, str) or not CODE_RE.match(c):
                    raise TableError(f"{where}: {key}: fault code {str(c)[:32]!r} is not 9 digits")
                self.levels[c] = level
        if not all(isinstance(r, str) and r for r in resources):
            raise TableError(f"{where}: publicFaultResource must hold non-empty strings")
        self.resources: tuple[str, ...] = tuple(dict.fromkeys(resources))

    @classmethod
    def load(cls, path: str | Path) -> PublicFaultTable:
        """Read and validate a table file. Raises :class:`TableError` (or ``OSError``)."""
        size = Path(path).stat().st_size
        if size > MAX_TABLE_BYTES:
            raise TableError(f"{path}: {size} bytes, larger than {MAX_TABLE_BYTES}")
        try:
            return cls(orjson.loads(Path(path).read_bytes()), str(path))
        except orjson.JSONDecodeError as e:
            raise TableError(f"{path}: not JSON: {e}") from e


class RequestInvalid(ValueError):
    """A request-level validation failure (code 409)."""


def _time_ok(ms: int) -> bool:
    return len(str(ms)) == 13 and ms >= MIN_TIME_MS


def validate_request(req: pubfault_pb2.PublicFaultRequest, table: PublicFaultTable) -> None:
    """Request-level rules of §5 step 2. Raises :class:`RequestInvalid` with the reason."""
    if not ID_RE.match(req.id):
        raise RequestInvalid(f"id {req.id[:140]!r} does not match {ID_RE.pattern}")
    if not _time_ok(req.timestamp):
        raise RequestInvalid(f"timestamp {req.timestamp} is not 13 digits of ms since 2025-01-01")
    if req.version != "1.0":
        raise RequestInvalid(f"version {req.version[:16]!r} is not 1.0")
    if req.resource not in table.resources:
        raise RequestInvalid(f"resource {req.resource[:64]!r} is not allowed")
    if not 1 <= len(req.faults) <= 100:
        raise RequestInvalid(f"faults must hold 1..100 items, got {len(req.faults)}")


def validate_fault(
    f: pubfault_pb2.Fault, table: PublicFaultTable, sn_to_node: dict[str, str]
) -> list[tuple[str, list[int]]]:
    """Fault-level rules of §5 step 3. Returns [(node, device_ids)]. Raises ``ValueError`` with the reason."""
    if not ID_RE.match(f.faultId):
        raise ValueError("faultId is invalid")
    if f.faultType not in FAULT_TYPES:
        raise ValueError(f"faultType {f.faultType[:32]!r} is invalid")
    if len(f.faultCode) != 9 or f.faultCode not in table.levels:
        raise ValueError(f"faultCode {f.faultCode[:32]!r} is not in the public fault table")
    if not _time_ok(f.faultTime):
        raise ValueError(f"faultTime {f.faultTime} is invalid")
    if f.assertion not in ASSERTIONS:
        raise ValueError(f"assertion {f.assertion[:32]!r} is invalid")
    if len(f.faultLocation) > 10 or any(len(k) > 16 or len(v) > 128 for k, v in f.faultLocation.items()):
        raise ValueError("faultLocation has too many or too long entries")
    if not DESC_RE.match(f.description):
        raise ValueError("description is too long or has control characters")
    if not 1 <= len(f.influence) <= 1000:
        raise ValueError(f"influence must hold 1..1000 entries, got {len(f.influence)}")
    out = []
    for inf in f.influence:
        node = inf.nodeName
        if node:
            if not NODE_RE.match(node):
                raise ValueError(f"nodeName {node[:64]!r} is invalid")
        else:
            node = sn_to_node.get(inf.nodeSN, "")
            if not inf.nodeSN or not node:
                raise ValueError(f"nodeSN {inf.nodeSN[:64]!r} resolves to no node")
        ids = list(inf.deviceIds)
        if not 1 <= len(ids) <= 32 or len(set(ids)) != len(ids) or any(not 0 <= d <= 31 for d in ids):
            raise ValueError("deviceIds must hold 1..32 distinct ids in [0, 31]")
        out.append((node, ids))
    return out


class CacheFull(ValueError):
    """A public fault request that would take the cache over a cap (nothing applied)."""


def over_cap(index: FaultIndex, resource: str, accepted, max_items: int) -> str:
    """Why ``accepted`` (faults of one request) would take the public faults of ``index`` (the fault
    center's) over ``max_items`` items or :data:`MAX_RECORDS` device records, or "" (see
    :meth:`PubFaultComponent._cap_guard`)."""
    items_now = index.groups_of_origin("public")
    records_now = index.count_of_origin("public")
    adds = [(f, t) for f, t in accepted if f.assertion != RECOVER]
    most_items = sum(len(t) for _, t in adds)
    most_records = sum(len(ids) for _, t in adds for _, ids in t)
    if items_now + most_items <= max_items and records_now + most_records <= MAX_RECORDS:
        return ""  # cannot exceed: no need to count exactly
    groups: set[tuple[str, str]] = set()
    records: set[FaultKey] = set()
    for f, targets in adds:
        source = f"public:{resource}:{f.faultId}"
        for node, ids in targets:
            if not index.has_group("public", node, source):
                groups.add((node, source))
            records.update(
                k
                for k in (FaultKey(node, f.faultType, d, f.faultCode, source) for d in ids)
                if index.get(k) is None
            )
    if items_now + len(groups) > max_items:
        return (
            f"public fault cache full: the request adds {len(groups)} items to {items_now}, "
            f"limit {max_items} (one item per influence entry); nothing was applied"
        )
    if records_now + len(records) > MAX_RECORDS:
        return (
            f"public fault cache full: the request adds {len(records)} device faults to "
            f"{records_now}, limit {MAX_RECORDS}; nothing was applied"
        )
    return ""
