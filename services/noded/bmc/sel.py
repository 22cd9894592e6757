"""System Event Log (SEL): records, incremental reading with a cursor, and the event -> fault table.

Used for any BMC without the Huawei OEM alarm command (issue 3 "BMC access"). IPMI 2.0 §31:
Get SEL Info (netfn 0x0A cmd 0x40), Get SEL Entry (0x43), Add (0x44), Clear (0x47); §32.1 the
16-byte record (type 0x02 = system event: generator, sensor type, sensor number, event dir/type,
event data 1..3; 0xC0..0xDF OEM timestamped, 0xE0..0xFF OEM non-timestamped).

Reading: :class:`SelCursor` remembers the last record id read and the SEL's erase time, so each
event is read (and reported) once. A changed erase time, or the cursor's record gone, means the
SEL was cleared: the reader starts from the first record and reports ``cleared=True``.

Faults: :class:`SelEventTable` maps (sensor type, event/reading type, event offset) to a fault code,
level and device type. An asserted event makes the fault active for (device type, sensor number);
the matching deassertion event, or clearing the SEL, recovers it (:class:`SelFaultTracker`).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from faultmesh.levels import NodeLevel

NETFN_STORAGE = 0x0A
CMD_GET_SEL_INFO = 0x40
CMD_GET_SEL_ALLOC = 0x41
CMD_RESERVE_SEL = 0x42
CMD_GET_SEL_ENTRY = 0x43
CMD_ADD_SEL_ENTRY = 0x44
CMD_DELETE_SEL_ENTRY = 0x46
CMD_CLEAR_SEL = 0x47
CMD_GET_SEL_TIME = 0x48
CMD_SET_SEL_TIME = 0x49
FIRST_RECORD = 0x0000
LAST_RECORD = 0xFFFF
RECORD_LEN = 16
SYSTEM_EVENT = 0x02
CC_NOT_PRESENT = 0xCB
MAX_RECORDS_PER_POLL = 4096  # guard against a BMC whose next-record chain loops

Raw = Callable[[int, int, bytes], bytes]


class SelError(ValueError):
    """A SEL reply that cannot be used; ``reason``: ``short``, ``loop``, ``entry``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SelInfo(NamedTuple):
    """Get SEL Info: ``entries``, ``free_bytes``, ``add_ts``/``erase_ts`` (BMC seconds), ``version``."""

    version: int
    entries: int
    free_bytes: int
    add_ts: int
    erase_ts: int
    support: int


def parse_sel_info(d: bytes) -> SelInfo:
    """Get SEL Info reply data (14 bytes) -> :class:`SelInfo`. Raises :class:`SelError` ``short``."""
    if len(d) < 14:
        raise SelError("short", f"Get SEL Info reply of {len(d)} bytes, need 14")
    version, entries, free, add_ts, erase_ts, support = struct.unpack_from("<BHHIIB", bytes(d), 0)
    return SelInfo(version, entries, free, add_ts, erase_ts, support)


def encode_sel_info(info: SelInfo) -> bytes:
    """:class:`SelInfo` -> 14 bytes (simulator)."""
    return struct.pack("<BHHIIB", *info)


class SelRecord(NamedTuple):
    """One SEL record. For system events (``record_type`` 0x02) the event fields are meaningful.

    ``deassert``: event direction bit; ``event_type``: event/reading type code (0x01 threshold,
    0x6F sensor-specific, ...); ``offset``: event data 1 bits 3..0.
    """

    record_id: int
    record_type: int
    timestamp: int
    generator_id: int
    sensor_type: int
    sensor_num: int
    event_type: int
    deassert: bool
    offset: int
    data: tuple[int, int, int]
    raw: bytes

    @property
    def is_system_event(self) -> bool:
        """Record type 0x02 (system event)."""
        return self.record_type == SYSTEM_EVENT

    @property
    def is_oem(self) -> bool:
        """Record types 0xC0..0xFF (OEM timestamped / non-timestamped)."""
        return self.record_type >= 0xC0


def parse_record(rec: bytes) -> SelRecord:
    """16 record bytes -> :class:`SelRecord`. Raises :class:`SelError` ``entry`` on a wrong length."""
    rec = bytes(rec)
    if len(rec) != RECORD_LEN:
        raise SelError("entry", f"SEL record of {len(rec)} bytes, need 16")
    rid, rtype, ts, gen = struct.unpack_from("<HBIH", rec, 0)
    dir_type = rec[12]
    return SelRecord(
        record_id=rid,
        record_type=rtype,
        timestamp=ts,
        generator_id=gen,
        sensor_type=rec[10],
        sensor_num=rec[11],
        event_type=dir_type & 0x7F,
        deassert=bool(dir_type & 0x80),
        offset=rec[13] & 0x0F,
        data=(rec[13], rec[14], rec[15]),
        raw=rec,
    )


def make_event_record(
    sensor_type: int,
    sensor_num: int,
    offset: int,
    *,
    event_type: int = 0x6F,
    deassert: bool = False,
    record_id: int = 0,
    timestamp: int = 0,
    generator_id: int = 0x0020,
    ed2: int = 0xFF,
    ed3: int = 0xFF,
) -> bytes:
    """A 16-byte system event record (as Add SEL Entry takes it)."""
    dir_type = (0x80 if deassert else 0) | (event_type & 0x7F)
    return struct.pack(
        "<HBIHBBBBBBB",
        record_id & 0xFFFF,
        SYSTEM_EVENT,
        timestamp & 0xFFFFFFFF,
        generator_id & 0xFFFF,
        0x04,
        sensor_type & 0xFF,
        sensor_num & 0xFF,
        dir_type,
        offset & 0x0F,
        ed2 & 0xFF,
        ed3 & 0xFF,
    )


@dataclass
class SelCursor:
    """Where SEL reading stopped: ``last_id`` (None before the first read) and the SEL ``erase_ts``."""

    last_id: int | None = None
    erase_ts: int | None = None
    add_ts: int | None = None


def _get_entry(raw: Raw, record_id: int) -> tuple[int, SelRecord]:
    d = raw(NETFN_STORAGE, CMD_GET_SEL_ENTRY, struct.pack("<HHBB", 0, record_id, 0, 0xFF))
    if len(d) < 2 + RECORD_LEN:
        raise SelError("short", f"Get SEL Entry {record_id:#06x} reply of {len(d)} bytes, need 18")
    nxt = struct.unpack_from("<H", d, 0)[0]
    return nxt, parse_record(d[2 : 2 + RECORD_LEN])


def read_new_records(raw: Raw, cursor: SelCursor) -> tuple[list[SelRecord], SelCursor, bool]:
    """Read the records added since ``cursor``. Returns (records, new cursor, cleared).

    ``raw(netfn, cmd, data) -> reply data`` raises an exception with ``code == 0xCB`` (see
    :class:`noded.bmc.client.BmcCommandError`) when a record is not present; other errors
    propagate. ``cleared`` is True when the SEL was cleared since the cursor (then every record
    now in the SEL is returned). Raises :class:`SelError` for bad replies.
    """
    info = parse_sel_info(raw(NETFN_STORAGE, CMD_GET_SEL_INFO, b""))
    cleared = False
    start = FIRST_RECORD
    if cursor.last_id is not None:
        if cursor.erase_ts is not None and info.erase_ts != cursor.erase_ts:
            cleared = True
        else:
            # Re-read the cursor's record for its next-record id. (The "most recent addition" time
            # alone cannot say "nothing new": it has a 1 s resolution, two events in one second
            # share it.)
            try:
                nxt, _ = _get_entry(raw, cursor.last_id)
            except Exception as e:
                if getattr(e, "code", None) != CC_NOT_PRESENT:
                    raise
                cleared = True
            else:
                if nxt == LAST_RECORD:
                    return [], SelCursor(cursor.last_id, info.erase_ts, info.add_ts), False
                start = nxt
    if cleared:
        start = FIRST_RECORD
    records: list[SelRecord] = []
    last_id = None if cleared else cursor.last_id
    if info.entries == 0:
        return records, SelCursor(last_id, info.erase_ts, info.add_ts), cleared
    rid = start
    seen: set[int] = set()
    while rid != LAST_RECORD:
        try:
            nxt, rec = _get_entry(raw, rid)
        except Exception as e:
            if getattr(e, "code", None) == CC_NOT_PRESENT and rid == FIRST_RECORD:
                break  # empty SEL
            raise
        if rec.record_id in seen or len(records) >= MAX_RECORDS_PER_POLL:
            raise SelError("loop", f"SEL next-record chain loops at {rid:#06x}")
        seen.add(rec.record_id)
        records.append(rec)
        last_id = rec.record_id
        rid = nxt
    return records, SelCursor(last_id, info.erase_ts, info.add_ts), cleared


# -- event -> fault table -----------------------------------------------------------------------
_CODE_RE = re.compile(r"^[A-Z0-9]{8}$")


class SelTableError(ValueError):
    """A SEL event table that cannot be used; the message names the row and field."""


@dataclass(frozen=True)
class SelEventRule:
    """One row: events with ``sensor_type``/``event_type``/``offset`` are fault ``code`` at ``level``
    on ``device_type`` (device id = sensor number); ``name`` is a human description."""

    sensor_type: int
    event_type: int
    offset: int
    code: str
    level: NodeLevel
    device_type: str
    name: str


def _int(v, field: str, row: int, hi: int) -> int:
    try:
        x = int(v, 0) if isinstance(v, str) else int(v)
    except (TypeError, ValueError):
        raise SelTableError(f"row {row}: {field} {v!r} is not a number") from None
    if not 0 <= x <= hi:
        raise SelTableError(f"row {row}: {field} {x} out of range 0..{hi}")
    return x


class SelEventTable:
    """(sensor type, event type, offset) -> :class:`SelEventRule`.

    File format (JSON)::

        {"SelEvents": [{"SensorType": "0x0C", "EventType": "0x6F", "Offsets": ["0x01"],
                        "FaultCode": "F10C6F01", "FaultLevel": "PreSeparateFault",
                        "DeviceType": "Memory", "Name": "uncorrectable ECC"}, ...]}

    ``Offsets`` may list several offsets sharing one code; ``EventType`` defaults to 0x6F
    (sensor-specific). A key listed twice rejects the table.
    """

    def __init__(self, rules: Iterable[SelEventRule]) -> None:
        self.rules: dict[tuple[int, int, int], SelEventRule] = {}
        for r in rules:
            key = (r.sensor_type, r.event_type, r.offset)
            if key in self.rules:
                raise SelTableError(f"SEL event {key} listed twice")
            self.rules[key] = r

    def __len__(self) -> int:
        return len(self.rules)

    def lookup(self, rec: SelRecord) -> SelEventRule | None:
        """The rule for a system event record, or None (unmapped)."""
        return self.rules.get((rec.sensor_type, rec.event_type, rec.offset))

    @classmethod
    def from_json(cls, data: bytes | str) -> SelEventTable:
        """Parse and validate. Raises :class:`SelTableError`."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SelTableError(f"not JSON: {e}") from None
        rows = doc.get("SelEvents") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise SelTableError("missing list SelEvents")
        rules = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise SelTableError(f"row {i}: not an object")
            st = _int(row.get("SensorType"), "SensorType", i, 0xFF)
            et = _int(row.get("EventType", 0x6F), "EventType", i, 0x7F)
            offsets = row.get("Offsets")
            if not isinstance(offsets, list) or not offsets:
                raise SelTableError(f"row {i}: Offsets must be a non-empty list")
            code = str(row.get("FaultCode", "")).upper()
            if not _CODE_RE.match(code):
                raise SelTableError(f"row {i}: FaultCode {row.get('FaultCode')!r} is not 8 letters/digits")
            try:
                level = NodeLevel.parse(str(row.get("FaultLevel", "")))
            except ValueError as e:
                raise SelTableError(f"row {i}: {e}") from None
            dtype = str(row.get("DeviceType") or "System")
            name = str(row.get("Name") or "")
            for off in offsets:
                rules.append(SelEventRule(st, et, _int(off, "Offsets", i, 0x0F), code, level, dtype, name))
        return cls(rules)


class SelFaultTracker:
    """Active SEL faults: (device type, sensor number, code) -> (rule, first-seen BMC timestamp).

    :meth:`apply` takes newly read records: an asserted mapped event activates its fault, the
    matching deassertion recovers it; ``cleared=True`` (the SEL was cleared) recovers everything
    first. Returns counts ``{"mapped", "unmapped", "oem", "unknown_type"}`` for metrics.
    """

    def __init__(self) -> None:
        self.active: dict[tuple[str, int, str], tuple[SelEventRule, int]] = {}

    def apply(self, table: SelEventTable, records: Iterable[SelRecord], cleared: bool) -> dict[str, int]:
        """Apply newly read ``records`` (after recovering everything when ``cleared``); returns counts."""
        counts = {"mapped": 0, "unmapped": 0, "oem": 0, "unknown_type": 0}
        if cleared:
            self.active.clear()
        for rec in records:
            if rec.is_oem:
                counts["oem"] += 1
                continue
            if not rec.is_system_event:
                counts["unknown_type"] += 1
                continue
            rule = table.lookup(rec)
            if rule is None:
                counts["unmapped"] += 1
                continue
            counts["mapped"] += 1
            key = (rule.device_type, rec.sensor_num, rule.code)
            if rec.deassert:
                self.active.pop(key, None)
            elif key not in self.active:
                self.active[key] = (rule, rec.timestamp)
        return counts


DEFAULT_SEL_TABLE = "sel_events.json"


def load_sel_table(path: str | None) -> SelEventTable:
    """The SEL event table from ``path`` (``--sel-events-file``), else noded's own. Raises
    ``ValueError`` for an invalid table and ``OSError`` for an unreadable file."""
    raw = (
        Path(path).read_bytes() if path else resources.files("noded").joinpath(DEFAULT_SEL_TABLE).read_bytes()
    )
    try:
        return SelEventTable.from_json(raw)
    except SelTableError as e:
        raise ValueError(f"SEL event table: {e}") from None
