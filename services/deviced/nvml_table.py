"""faultmesh's NVIDIA fault table (issue 33): XIDs and NVML conditions -> NPU levels.

The table is ``deviced/data/nvidiaFaultTable.json`` (faultmesh's own file; the facts follow NVIDIA's
published Xid catalog and recovery actions, the levels are faultmesh's choice with a ``note`` where the
catalog leaves it open). This module reads it into the shapes deviced's engine already runs on:

- :class:`NvidiaCodeTable` — a :class:`deviced.tables.FaultCodeTable` whose codes are XIDs and NVML
  conditions (``xid_code`` / ``condition_code``); an XID that is not listed gets the table's
  ``DefaultXid`` level and is marked unknown (the engine counts it in ``unknown_code``);
- a :class:`deviced.tables.Customization` with the table's frequency and duration rules;
- :class:`Entry` records (meaning, impact, handling, note) for ``faultmesh explain xid N``;
- the polling thresholds (``sbe_volatile``, ``nvlink_errors``, ``pcie_replay``).

Code space (never collides with Ascend's 32-bit codes nor faultmesh's 33-bit synthetic ones): XID n is
``0x4E5600000000 + n``, NVML condition k is ``0x4E5600010000 + k``. Errors: :class:`TableError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviced.tables import (
    CHIP_BUCKETS,
    Customization,
    FaultCodeTable,
    TableError,
    _read_json,
)
from faultmesh.levels import NpuLevel

XID_BASE = 0x4E5600000000
COND_BASE = XID_BASE + 0x10000
MAX_XID = 0xFFFF
DEFAULT_NAME = "nvidiaFaultTable.json"
CLEARS = ("once", "reset")


def xid_code(xid: int) -> int:
    """The faultmesh code of XID ``xid`` (0..65535). Raises ``ValueError`` outside that range."""
    if not 0 <= xid <= MAX_XID:
        raise ValueError(f"XID {xid} outside 0..{MAX_XID}")
    return XID_BASE + xid


def condition_code(cid: int) -> int:
    """The faultmesh code of NVML condition id ``cid`` (1..65535)."""
    return COND_BASE + cid


def code_xid(code: int) -> int | None:
    """The XID a code stands for, or None when it is not an XID code."""
    return code - XID_BASE if XID_BASE <= code <= XID_BASE + MAX_XID else None


@dataclass(frozen=True)
class Entry:
    """One table row: ``key`` ("xid 79" / "gpu-lost"), ``code``, ``name``, ``level``, ``clear`` (XIDs:
    once / reset), ``catalog`` (NVIDIA's immediate-action bucket), ``meaning``, ``impact``,
    ``handling``, ``note`` (why faultmesh chose the level, where it had to)."""

    key: str
    code: int
    name: str
    level: NpuLevel
    clear: str = "once"
    catalog: str = ""
    meaning: str = ""
    impact: str = ""
    handling: str = ""
    note: str = ""


class NvidiaCodeTable(FaultCodeTable):
    """A :class:`FaultCodeTable` over the NVIDIA code space: unlisted XIDs take ``default_level``."""

    def __init__(self, buckets, spellings, default_level: NpuLevel) -> None:
        super().__init__(buckets, {}, spellings)
        self.default_level = default_level

    def chip_code_level(self, code: int, severity: int | None = 0) -> tuple[NpuLevel, bool]:
        """(level, unknown): listed codes their bucket; other XIDs the default level (unknown=True)."""
        lvl = self.listed_level(code)
        if lvl is not None:
            return lvl, False
        if code_xid(code) is not None:
            return self.default_level, True
        return self.severity_level(severity), True


@dataclass
class NvidiaTable:
    """The loaded table: ``entries`` by code, ``by_key`` ("xid 79", "gpu-lost"), ``conditions`` (name ->
    code), ``default`` (the unlisted-XID entry), ``thresholds``, ``codes`` (the engine's code table),
    ``custom`` (its frequency / duration rules)."""

    entries: dict[int, Entry]
    by_key: dict[str, Entry]
    conditions: dict[str, int]
    default: Entry
    thresholds: dict[str, int]
    codes: NvidiaCodeTable
    custom: Customization

    @classmethod
    def load(cls, path: str | Path | None = None) -> NvidiaTable:
        """Read ``path`` (None: faultmesh's default). Raises :class:`TableError` naming the problem."""
        obj, name = _read_json(path, DEFAULT_NAME)
        return cls.from_obj(obj, name)

    @classmethod
    def from_obj(cls, obj: Any, name: str = DEFAULT_NAME) -> NvidiaTable:
        """Build from the parsed JSON. Every row must be valid (a data file of faultmesh's, not an
        operator's: a bad row is a bug, so it raises :class:`TableError`)."""
        if not isinstance(obj, dict):
            raise TableError(f"{name}: top level must be an object")
        entries: dict[int, Entry] = {}
        by_key: dict[str, Entry] = {}
        conditions: dict[str, int] = {}
        for i, row in enumerate(obj.get("Xids") or []):
            where = f"{name}: Xids[{i}]"
            xid = _int(row, "xid", where)
            e = _entry(row, f"xid {xid}", xid_code(xid), where)
            if e.clear not in CLEARS:
                raise TableError(f"{where}: clear {e.clear!r} not one of {CLEARS}")
            _put(entries, by_key, e, where)
        for i, row in enumerate(obj.get("Conditions") or []):
            where = f"{name}: Conditions[{i}]"
            cid = _int(row, "id", where)
            cond = row.get("condition")
            if not isinstance(cond, str) or not cond:
                raise TableError(f"{where}: condition must be a name")
            e = _entry(row, cond, condition_code(cid), where, clear="condition")
            _put(entries, by_key, e, where)
            conditions[cond] = e.code
        d = obj.get("DefaultXid")
        if not isinstance(d, dict):
            raise TableError(f"{name}: DefaultXid must be an object")
        default = _entry({"name": "XID not in the table", **d}, "xid *", XID_BASE, f"{name}: DefaultXid")
        thresholds = obj.get("Thresholds") or {}
        if not all(isinstance(v, int) and v >= 0 for v in thresholds.values()):
            raise TableError(f"{name}: Thresholds must be non-negative integers")
        buckets: dict[NpuLevel, set[int]] = {level: set() for _k, level in CHIP_BUCKETS}
        for e in entries.values():
            if e.level not in buckets:
                raise TableError(f"{name}: {e.key}: level {e.level.name} is not a table level")
            buckets[e.level].add(e.code)
        spellings = {c: f"{c:012X}" for c in entries}
        custom = Customization.from_obj(_rules(obj, conditions, name), name)
        if custom.rejected:
            raise TableError(f"{name}: rules rejected: {'; '.join(custom.rejected)}")
        return cls(
            entries,
            by_key,
            conditions,
            default,
            dict(thresholds),
            NvidiaCodeTable(buckets, spellings, default.level),
            custom,
        )

    def lookup(self, code: int) -> Entry | None:
        """The row of ``code``; an unlisted XID gets the default row (its key names the XID)."""
        e = self.entries.get(code)
        if e is None and (xid := code_xid(code)) is not None:
            return Entry(**{**self.default.__dict__, "key": f"xid {xid}", "code": code})
        return e

    def clears_on_reset(self, code: int) -> bool:
        """True when an XID code is held until the GPU is reset (``clear: reset``)."""
        e = self.entries.get(code)
        return e is not None and e.clear == "reset"


def _int(row: Any, key: str, where: str) -> int:
    if not isinstance(row, dict):
        raise TableError(f"{where}: not an object")
    v = row.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_XID:
        raise TableError(f"{where}: {key} must be an integer 0..{MAX_XID}")
    return v


def _entry(row: dict, key: str, code: int, where: str, clear: str | None = None) -> Entry:
    try:
        level = NpuLevel.parse(str(row.get("level")))
    except ValueError as e:
        raise TableError(f"{where}: {e}") from None
    text = {k: str(row.get(k, "")) for k in ("name", "catalog", "meaning", "impact", "handling", "note")}
    return Entry(key, code, level=level, clear=clear or str(row.get("clear", "once")), **text)


def _put(entries: dict[int, Entry], by_key: dict[str, Entry], e: Entry, where: str) -> None:
    if e.code in entries or e.key in by_key:
        raise TableError(f"{where}: {e.key} listed twice")
    entries[e.code] = e
    by_key[e.key] = e


def _rules(obj: dict, conditions: dict[str, int], name: str) -> dict:
    """The table's rules in faultCustomization.json's shape (XIDs / condition names -> hex codes)."""

    def ids(r: dict) -> list[str]:
        codes = [xid_code(x) for x in r.get("Xids") or []]
        for c in r.get("Conditions") or []:
            if c not in conditions:
                raise TableError(f"{name}: rule names unknown condition {c!r}")
            codes.append(conditions[c])
        return [f"{c:012X}" for c in codes]

    def strip(r: Any) -> dict:
        if not isinstance(r, dict):
            raise TableError(f"{name}: a rule must be an object")
        out = {k: v for k, v in r.items() if k not in ("Xids", "Conditions")}
        out["EventId"] = ids(r)
        return out

    return {
        "FaultFrequency": [strip(r) for r in obj.get("FaultFrequency") or []],
        "FaultDuration": [strip(r) for r in obj.get("FaultDuration") or []],
    }
