"""Huawei iBMC "get current alarms" OEM command: request, reply codec, paging, device types.

Source: reference noded.md §1. The request is netfn 0x30, cmd 0x94 with data
``DB 07 00 40 00 <index LE16> 0E FF`` (IANA 0x0007DB little-endian, sub-function 0x40, start index,
at most 14 records per reply, all severities). The reply *data* (after the completion code, which
pyghmi strips and turns into an exception) is::

    0..2  IANA echo DB 07 00
    3..4  total number of current alarms, LE16 (read from the first reply only)
    5     number of records in this reply
    6     continuation flag (ignored)
    7..   records, 15 bytes each

A record is: bytes 0..3 alarm code (LE uint32, rendered as 8 upper-case hex digits, so
``31 00 00 2C`` -> ``"2C000031"``), 4..7 ignored (timestamp), 8 severity, 9 device type (table below),
10 device index, 11..14 ignored.

Paging: first call with index 0, then ``index += count``, ``remaining = total - count`` while
``remaining > 0``, at most 100 follow-up calls, index within 0..65535.

Deliberate differences from the reference (issue 3 "Bad input"): every inconsistency rejects the
whole poll with :class:`OemReplyError` (the reference skips a page whose record area is not a
multiple of 15 and keeps paging, and never checks the record count against the record area), so
the caller keeps its previous alarm set instead of publishing a partial one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import NamedTuple

from faultmesh.ibmc import DEVICE_TYPES, UNKNOWN_TYPE

NETFN = 0x30
CMD = 0x94
CMD_GET_INFO = 0x90  # serial number / manufacturer (reference noded.md §1 "Node SN")
IANA = 0x0007DB
IANA_BYTES = bytes((0xDB, 0x07, 0x00))
SUBFUNCTION = 0x40
SELECTOR = 0x00
PAGE_RECORDS = 0x0E  # at most 14 records per reply (14 * 15 + 8 fits one IPMI reply)
FILTER_ALL = 0xFF
RECORD_LEN = 15
HEADER_LEN = 7  # reply data header without the completion code
MAX_FOLLOWUPS = 100
# The most alarms a poll can page through: the first reply plus 100 follow-ups of 14 records.
MAX_TOTAL = PAGE_RECORDS * (MAX_FOLLOWUPS + 1)

_TYPE_BYTES: dict[str, int] = {}
for _b, _n in sorted(DEVICE_TYPES.items()):
    _TYPE_BYTES.setdefault(_n.lower(), _b)


def device_type_name(type_byte: int) -> str:
    """Device-type byte -> name; bytes not in the table give ``"UNKNOWN"`` (reference noded.md §1)."""
    return DEVICE_TYPES.get(type_byte, UNKNOWN_TYPE)


def device_type_byte(name_or_byte: str | int) -> int:
    """Name (case-insensitive) or number (``3``, ``"0x03"``) -> device-type byte. Raises ``ValueError``."""
    if isinstance(name_or_byte, int):
        value = name_or_byte
    else:
        key = name_or_byte.strip().lower()
        if key in _TYPE_BYTES:
            return _TYPE_BYTES[key]
        try:
            value = int(key, 0)
        except ValueError:
            raise ValueError(f"unknown device type {name_or_byte!r}") from None
    if not 0 <= value <= 0xFF:
        raise ValueError(f"device type byte out of range: {value}")
    return value


class OemReplyError(ValueError):
    """An OEM alarm reply that cannot be used. ``reason`` is a short stable word for metrics/logs:
    ``short``, ``iana``, ``ragged``, ``count``, ``total``, ``stalled``, ``overrun``, ``index``, ``pages``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class AlarmRecord(NamedTuple):
    """One current iBMC alarm.

    ``code``: 8 upper-case hex digits; ``severity``: the record's severity byte (0..255);
    ``type_byte``: device-type byte; ``device_id``: device index byte (0..255).
    """

    code: str
    severity: int
    type_byte: int
    device_id: int

    @property
    def device_type(self) -> str:
        """Device-type name by the reference table (``"UNKNOWN"`` for unlisted bytes)."""
        return device_type_name(self.type_byte)


class OemPage(NamedTuple):
    """One parsed reply: ``total`` alarms on the BMC, ``flag`` byte, ``records`` in this reply."""

    total: int
    flag: int
    records: list[AlarmRecord]


def encode_index(index: int) -> bytes:
    """Start index -> 2 bytes LE; a value <= 0 or > 65535 encodes as ``00 00`` (reference noded.md §1)."""
    if index <= 0 or index > 0xFFFF:
        return b"\x00\x00"
    return struct.pack("<H", index)


def build_request(index: int) -> bytes:
    """Request data (9 bytes, without netfn/cmd) for the page starting at ``index``."""
    return (
        IANA_BYTES + bytes((SUBFUNCTION, SELECTOR)) + encode_index(index) + bytes((PAGE_RECORDS, FILTER_ALL))
    )


def parse_request(data: bytes) -> int:
    """Request data -> start index (used by the simulator). Raises :class:`OemReplyError` ``request``."""
    if len(data) != 9 or bytes(data[:3]) != IANA_BYTES or data[3] != SUBFUNCTION:
        raise OemReplyError("request", f"not a get-current-alarms request: {bytes(data).hex()}")
    return struct.unpack_from("<H", bytes(data), 5)[0]


def parse_record(rec: bytes) -> AlarmRecord:
    """One 15-byte record -> :class:`AlarmRecord`. Raises ``ValueError`` on a wrong length."""
    if len(rec) != RECORD_LEN:
        raise ValueError(f"alarm record must be {RECORD_LEN} bytes, got {len(rec)}")
    code = struct.unpack_from("<I", rec, 0)[0]
    return AlarmRecord(f"{code:08X}", rec[8], rec[9], rec[10])


def encode_record(rec: AlarmRecord, timestamp: int = 0) -> bytes:
    """:class:`AlarmRecord` -> 15 bytes (``timestamp`` fills the ignored bytes 4..7)."""
    return (
        struct.pack("<II", int(rec.code, 16), timestamp & 0xFFFFFFFF)
        + bytes((rec.severity & 0xFF, rec.type_byte & 0xFF, rec.device_id & 0xFF))
        + b"\x00\x00\x00\x00"
    )


def parse_reply(data: bytes) -> OemPage:
    """Reply data (completion code already stripped) -> :class:`OemPage`.

    Raises :class:`OemReplyError`: ``short`` (< 7 bytes), ``iana`` (echo is not DB 07 00),
    ``ragged`` (record area not a multiple of 15), ``count`` (count byte != records present).
    """
    data = bytes(data)
    if len(data) < HEADER_LEN:
        raise OemReplyError("short", f"alarm reply too short: {len(data)} bytes")
    if data[:3] != IANA_BYTES:
        raise OemReplyError("iana", f"alarm reply IANA echo {data[:3].hex()} != db0700")
    total = struct.unpack_from("<H", data, 3)[0]
    count = data[5]
    area = data[HEADER_LEN:]
    if len(area) % RECORD_LEN:
        raise OemReplyError("ragged", f"alarm record area of {len(area)} bytes is not a multiple of 15")
    n = len(area) // RECORD_LEN
    if n != count:
        raise OemReplyError("count", f"alarm reply says {count} records but holds {n}")
    records = [parse_record(area[i : i + RECORD_LEN]) for i in range(0, len(area), RECORD_LEN)]
    return OemPage(total, data[6], records)


def encode_reply(total: int, records: Iterable[AlarmRecord], more: bool = False) -> bytes:
    """Reply data (without completion code) for the simulator: header + 15-byte records."""
    recs = list(records)
    body = b"".join(encode_record(r) for r in recs)
    return IANA_BYTES + struct.pack("<HBB", total & 0xFFFF, len(recs) & 0xFF, 1 if more else 0) + body


def read_alarms(query: Callable[[bytes], bytes], max_followups: int = MAX_FOLLOWUPS) -> list[AlarmRecord]:
    """Page through the BMC's current alarms with ``query(request_data) -> reply_data``.

    ``query`` raises on transport errors and non-zero completion codes; those propagate. Returns
    every record in BMC order. Raises :class:`OemReplyError` for a bad page (see
    :func:`parse_reply`) and for ``total`` (total > 1414 or below the first page's count),
    ``stalled`` (a follow-up with no records while alarms remain), ``overrun`` (more records than
    the total), ``index`` (index beyond 65535) and ``pages`` (more than ``max_followups`` follow-ups).
    """
    first = parse_reply(query(build_request(0)))
    total = first.total
    if total > MAX_TOTAL:
        raise OemReplyError("total", f"absurd alarm total {total} (at most {MAX_TOTAL} can be paged)")
    records = list(first.records)
    if len(records) > total:
        raise OemReplyError("total", f"first alarm reply holds {len(records)} records, total says {total}")
    index = len(records)
    followups = 0
    while len(records) < total:
        if followups >= max_followups:
            raise OemReplyError("pages", f"alarm paging needs more than {max_followups} follow-up requests")
        if index > 0xFFFF:
            raise OemReplyError("index", f"alarm index {index} beyond 65535")
        page = parse_reply(query(build_request(index)))
        followups += 1
        if not page.records:
            raise OemReplyError(
                "stalled", f"alarm reply at index {index} is empty, {total - len(records)} remain"
            )
        records.extend(page.records)
        if len(records) > total:
            raise OemReplyError(
                "overrun", f"alarm paging returned {len(records)} records, total says {total}"
            )
        index += len(page.records)
    return records
