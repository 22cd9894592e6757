"""Marker records of the lightweight-profiling format (reference fdol.md §1.3) and bad-input counting.

One line = one JSON object::

    {"Kind":1,"Flag":16,"SourceKind":1,"Timestamp":<ns>,"Id":<u64>,
     "MsptiObjectId":{"Pt":{"ProcessId":..,"ThreadId":..},"Ds":{"DeviceId":..,"StreamId":..}},
     "Name":"step 7","Domain":"default"}

Kinds: 1 marker (the only kind FD-OL uses; 2 kernel and 3 api are skipped and counted). SourceKind
0 host, 1 device. Flags: 1 instantaneous, 2 host range start, 4 host range end, 16 start with device
stream, 32 end with device stream. Usually only the first record of an ``Id`` carries Name/Domain.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from fdol import strictjson

KIND_MARKER = 1
SOURCE_HOST = 0
SOURCE_DEVICE = 1
FLAG_INSTANT = 1
FLAG_HOST_START = 2
FLAG_HOST_END = 4
FLAG_DEVICE_START = 16
FLAG_DEVICE_END = 32
START_FLAGS = frozenset((FLAG_HOST_START, FLAG_DEVICE_START))
END_FLAGS = frozenset((FLAG_HOST_END, FLAG_DEVICE_END))
VALID_FLAGS = START_FLAGS | END_FLAGS | {FLAG_INSTANT}

DOMAIN_DEFAULT = "default"
DOMAIN_COMMUNICATION = "communication"

# Largest timestamp accepted (ns): year 2262; anything larger is not a real clock.
MAX_TS_NS = (1 << 63) - 1


class Record(NamedTuple):
    """One marker record. ``ts`` in ns; ``name``/``domain`` are "" when the line carried none."""

    flag: int
    source_kind: int
    ts: int
    id: int
    name: str
    domain: str


class BadInput(Counter):
    """Rejected input counted per reason (a ``collections.Counter`` of reason -> count).

    Reasons used across the library: ``bad_json``, ``not_object``, ``missing_field``, ``bad_type``,
    ``not_marker``, ``bad_flag``, ``bad_timestamp``, ``truncated_line``, ``line_too_long``,
    ``file_truncated``, ``file_vanished``, ``rank_dir_missing``, ``bad_parallel_group``,
    ``negative_duration``, ``missing_end``, ``orphan_end``, ``unknown_name``, ``bad_step_name``,
    ``bad_comm_name``, ``clock_jump``, ``step_out_of_order``, ``buffer_overflow``, ``rank_stopped``
    (a local rank without new steps for 3 rounds while the others advance: judged without it).
    """

    def add(self, reason: str, n: int = 1) -> None:
        """Count ``n`` rejections for ``reason``."""
        self[reason] += n


def parse_line(line: bytes, bad: BadInput) -> Record | None:
    """Parse one JSON line into a :class:`Record`, or count why not and return None.

    Never raises. Non-marker kinds count as ``not_marker``; instantaneous markers are valid input
    but carry no duration, so they are returned (callers ignore them).
    """
    try:
        obj = strictjson.loads(line)
    except ValueError:
        bad.add("bad_json")
        return None
    if not isinstance(obj, dict):
        bad.add("not_object")
        return None
    try:
        kind = obj["Kind"]
        flag = obj["Flag"]
        sk = obj["SourceKind"]
        ts = obj["Timestamp"]
        rid = obj["Id"]
    except KeyError:
        bad.add("missing_field")
        return None
    if not all(type(v) is int for v in (kind, flag, sk, ts, rid)):
        bad.add("bad_type")
        return None
    if kind != KIND_MARKER:
        bad.add("not_marker")
        return None
    if flag not in VALID_FLAGS or sk not in (SOURCE_HOST, SOURCE_DEVICE):
        bad.add("bad_flag")
        return None
    if ts <= 0 or ts > MAX_TS_NS:
        bad.add("bad_timestamp")
        return None
    name = obj.get("Name", "")
    domain = obj.get("Domain", "")
    if not isinstance(name, str) or not isinstance(domain, str):
        bad.add("bad_type")
        return None
    if name == "NULL":
        name = ""
    if domain in ("NULL", "(null)"):
        domain = ""
    return Record(flag, sk, ts, rid, name, domain)


def encode_record(
    flag: int,
    source_kind: int,
    ts: int,
    rid: int,
    name: str | None = None,
    domain: str | None = None,
    pid: int = 0,
    tid: int = 0,
    device_id: int = 0,
    stream_id: int = 0,
) -> bytes:
    """Serialize one marker record as a JSON line (with trailing ``\\n``), field order as the reference.

    ``name``/``domain`` None writes ``"NULL"`` (what the reference writes for records after the first
    of an Id).
    """
    return (
        strictjson.dumps(
            {
                "Kind": KIND_MARKER,
                "Flag": flag,
                "SourceKind": source_kind,
                "Timestamp": ts,
                "Id": rid,
                "MsptiObjectId": {
                    "Pt": {"ProcessId": pid, "ThreadId": tid},
                    "Ds": {"DeviceId": device_id, "StreamId": stream_id},
                },
                "Name": "NULL" if name is None else name,
                "Domain": "NULL" if domain is None else domain,
            }
        )
        + b"\n"
    )
