"""``faultmesh explain xid N`` / ``faultmesh explain nvml CONDITION`` / ``faultmesh explain 4E560000004F``:
the NVIDIA part of ``explain`` (issue 33) -- meaning, impact, handling, NVIDIA's catalog bucket,
faultmesh's level with its reason, and the frequency / duration rules, from faultmesh's NVIDIA fault
table (``deviced/data/nvidiaFaultTable.json``).

Like :mod:`faultmesh.faultinfo` this is core code, so it imports no service: it reads the table by path
as a sibling of the ``faultmesh`` package. Exit status as ``explain``: 0 listed, 1 not listed (an XID
outside the table: its default level is shown), 2 malformed.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

from faultmesh import faultinfo

TABLE = Path(__file__).resolve().parents[2] / "deviced" / "data" / "nvidiaFaultTable.json"
XID_BASE = 0x4E5600000000  # deviced.nvml_table's code space: XID n, condition k at +0x10000
COND_BASE = XID_BASE + 0x10000
MAX_ID = 0xFFFF
WORDS = ("xid", "nvml")


@cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def wants(words: list[str]) -> bool:
    """True when ``words`` (explain's arguments) name an NVIDIA fault: ``xid N``, ``nvml NAME`` or a
    code of the NVIDIA code space."""
    if not words:
        return False
    if words[0].lower() in WORDS:
        return True
    try:
        code = int(words[0].lower().removeprefix("0x"), 16)
    except ValueError:
        return False
    return XID_BASE <= code <= COND_BASE + MAX_ID


def lookup(words: list[str]) -> tuple[dict[str, Any] | None, str, bool]:
    """(row, key, listed) for ``words``: the table's row (the DefaultXid row for an unlisted XID, None
    for an unknown condition), its key ("xid 79" / condition name) and whether the table lists it.
    Raises ``ValueError`` for malformed words."""
    t = _table()
    kind, arg = (words[0].lower(), words[1] if len(words) > 1 else "")
    if kind not in WORDS:
        code = int(words[0].lower().removeprefix("0x"), 16)
        kind, arg = ("xid", str(code - XID_BASE)) if code < COND_BASE else ("nvml", str(code - COND_BASE))
    if not arg:
        raise ValueError(f"{kind} needs an argument (e.g. 'xid 79', 'nvml gpu-lost')")
    if kind == "xid":
        if not arg.isdigit() or int(arg) > MAX_ID:
            raise ValueError(f"not an XID: {arg!r} (0..{MAX_ID})")
        xid = int(arg)
        row = next((r for r in t["Xids"] if r["xid"] == xid), None)
        return (
            (row, f"xid {xid}", True)
            if row
            else ({"name": "XID not in the table", **t["DefaultXid"]}, f"xid {xid}", False)
        )
    by = {r["condition"]: r for r in t["Conditions"]}
    by_id = {str(r["id"]): r for r in t["Conditions"]}
    row = by.get(arg) or by_id.get(arg)
    return row, row["condition"] if row else arg, row is not None


def _code(t: dict[str, Any], row: dict[str, Any], key: str) -> int:
    if key.startswith("xid "):
        return XID_BASE + int(key.split()[1])
    return COND_BASE + int(row["id"])


def _rules(t: dict[str, Any], row: dict[str, Any], key: str) -> list[str]:
    out = []
    for r in t.get("FaultFrequency") or []:
        if key.startswith("xid ") and int(key.split()[1]) in (r.get("Xids") or []):
            out.append(f"frequency: {r['Times']} times within {r['TimeWindow']} s -> {r['FaultHandling']}, "
                       f"released after {r.get('ReleaseTimeWindow')} s without recurrence")  # fmt: skip
    for r in t.get("FaultDuration") or []:
        if row.get("condition") in (r.get("Conditions") or []):
            out.append(f"duration: lasting more than {r['FaultTimeout']} s -> {r['FaultHandling']}, "
                       f"cleared after {r['RecoverTimeout']} s recovered")  # fmt: skip
    return out


def cmd(words: list[str], as_json: bool, out=None) -> int:
    """Print the NVIDIA explanation of ``words`` to ``out`` (default stdout); returns the exit status
    (0 / 1 / 2)."""
    out = out or sys.stdout
    try:
        row, key, listed = lookup(words)
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    if row is None:
        names = ", ".join(r["condition"] for r in _table()["Conditions"])
        sys.stderr.write(f"error: unknown NVML condition {key!r}; known: {names}\n")
        return 1
    t = _table()
    code = _code(t, row, key)
    level = row["level"]
    handling_en, handling_zh = faultinfo.level_handling(level)
    facts = {
        "key": key,
        "code": f"{code:012X}",
        "listed": listed,
        "name": row.get("name", ""),
        "meaning": row.get("meaning", ""),
        "impact": row.get("impact", ""),
        "handling": row.get("handling", ""),
        "nvidia_catalog_action": row.get("catalog", ""),
        "level": level,
        "level_handling": handling_en,
        "clear": row.get("clear", "condition" if "condition" in row else "once"),
        "note": row.get("note", ""),
        "rules": _rules(t, row, key),
    }
    if as_json:
        out.write(json.dumps(facts, ensure_ascii=False, indent=2) + "\n")
        return 0 if listed else 1
    w = out.write
    w(f"{key}  (NVIDIA GPU, code {facts['code']}){'' if listed else '  -- not in the table'}\n")
    for label, k in (("name", "name"), ("meaning", "meaning"), ("impact", "impact"), ("handling", "handling"),
                     ("NVIDIA", "nvidia_catalog_action")):  # fmt: skip
        if facts[k]:
            w(f"  {label + ':':10} {facts[k]}\n")
    w(f"level:     {level} (deviced --backend nvml, nvidiaFaultTable.json)\n")
    if handling_en:
        w(f"           -> {handling_en}{f' ({handling_zh})' if handling_zh else ''}\n")
    clear = {
        "once": "a one-off notice",
        "reset": "held until the GPU is reset",
        "condition": "while it lasts",
    }
    w(f"  ends:    {clear.get(facts['clear'], facts['clear'])}\n")
    if facts["note"]:
        w(f"  why:     {facts['note']}\n")
    w("rules:\n" if facts["rules"] else "rules:     none\n")
    for line in facts["rules"]:
        w(f"  {line}\n")
    return 0 if listed else 1
