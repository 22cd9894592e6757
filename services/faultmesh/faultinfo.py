"""What a fault code means, at which level each shipped table puts it, and which rules apply.

Sources:
- meanings: faultmesh's own text in ``faultmesh/tables/fault_meanings.json`` (module, name, business
  impact, handling; Chinese as the operator docs spell it), written from the reference's
  typical-faults tables (../shared/data/fault-tables/typical-faults-*.csv) and its per-code notes;
- levels and rules: the default tables faultmesh ships, in the reference's formats (reference
  deviced.md §3.2, §4, §7; noded.md §2; clusterd.md §5, §6.3).

The default tables belong to the services (``deviced/data/``, ``noded/``, ``clusterd/tables/``). This
module is core, so it imports no service: it reads those files by path, as siblings of the
``faultmesh`` package in the same source tree or install (one distribution installs all of them),
and parses them with the bucket precedence each service applies. ``tests/test_shipped_tables.py``
checks every code against the services' own loaders, so the two views cannot drift. Chip codes are
matched by value (``20001002`` is ``020001002``), as deviced matches them; switch codes by their
canonical spelling (:func:`faultmesh.faultrules.canonical_code`).

Errors: :func:`explain` raises ``ValueError`` for a malformed code; a missing or unreadable shipped
table is reported in :attr:`Explanation.missing_tables`, never raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from faultmesh.faultrules import (
    DurationTable,
    DurationTimeout,
    RelationRule,
    RelationTable,
    canonical_code,
    is_switch_code,
)
from faultmesh.ibmc import DEVICE_TYPES, UNKNOWN_TYPE

_SERVICES_ROOT = Path(__file__).resolve().parent.parent

# table -> (file under the services root, the object key holding the buckets or None for top level,
# [(bucket key, level)] in precedence order: the first bucket holding a code gives its level).
_BUCKET_TABLES: dict[str, tuple[str, str | None, tuple[tuple[str, str], ...]]] = {
    "faultCode.json": (
        "deviced/data/faultCode.json",
        None,
        (
            ("SeparateNPUCodes", "SeparateNPU"),
            ("PreSeparateNPUCodes", "PreSeparateNPU"),
            ("RestartNPUCodes", "RestartNPU"),
            ("FreeRestartNPUCodes", "FreeRestartNPU"),
            ("RestartBusinessCodes", "RestartBusiness"),
            ("RestartRequestCodes", "RestartRequest"),
            ("SubHealthFaultCodes", "SubHealthFault"),
            ("NotHandleFaultCodes", "NotHandleFault"),
            ("SeparateNPUNetworkCodes", "SeparateNPU"),
            ("PreSeparateNPUNetworkCodes", "PreSeparateNPU"),
            ("SubHealthFaultNetworkCodes", "SubHealthFault"),
            ("NotHandleFaultNetworkCodes", "NotHandleFault"),
        ),
    ),
    "SwitchFaultCode.json": (
        "deviced/data/SwitchFaultCode.json",
        None,
        (
            ("SeparateFaultCodes", "Separate"),
            ("ResetFaultCodes", "Separate"),
            ("PreSeparateFaultCodes", "PreSeparate"),
            ("RestartRequestFaultCodes", "RestartRequest"),
            ("SubHealthFaultCodes", "SubHealthFault"),
            ("NotHandleFaultCodes", "NotHandle"),
        ),
    ),
    "NodeDConfiguration.json": (
        "noded/NodeDConfiguration.json",
        "FaultTypeCode",
        (
            ("SeparateFaultCodes", "SeparateFault"),
            ("PreSeparateFaultCodes", "PreSeparateFault"),
            ("NotHandleFaultCodes", "NotHandleFault"),
        ),
    ),
    "publicFaultConfiguration.json": (
        "clusterd/tables/publicFaultConfiguration.json",
        "publicFaultCode",
        (
            ("SeparateNPUCodes", "SeparateNPU"),
            ("PreSeparateNPUCodes", "PreSeparateNPU"),
            ("SubHealthFaultCodes", "SubHealthFault"),
            ("NotHandleFaultCodes", "NotHandleFault"),
        ),
    ),
}
SEL_EVENTS = "noded/sel_events.json"
CUSTOMIZATION = "deviced/data/faultCustomization.json"
DURATION = "deviced/data/faultDuration.json"
RELATION = "deviced/data/relationFaultCustomization.json"
COMPONENT = {
    "faultCode.json": "deviced",
    "SwitchFaultCode.json": "deviced",
    "NodeDConfiguration.json": "noded",
    "sel_events.json": "noded",
    "publicFaultConfiguration.json": "clusterd",
}


@dataclass(frozen=True)
class Meaning:
    """faultmesh's description of one code; ``zh`` holds the operator docs' Chinese (module, name,
    impact, handling) where they give it; ``source`` says where the facts come from."""

    code: str
    module: str
    name: str
    impact: str
    handling: str
    zh: dict[str, str] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class TableLevel:
    """The level ``table`` gives a code: ``level`` (the first bucket by precedence), ``keys`` every
    bucket that lists it, ``spelling`` the code as the table writes it."""

    table: str
    component: str
    level: str
    keys: tuple[str, ...]
    spelling: str


@dataclass
class Explanation:
    """Everything faultmesh knows about one code (see :func:`explain`)."""

    code: str
    switch: bool
    meaning: Meaning | None
    levels: list[TableLevel]
    frequency: list[dict[str, Any]]
    duration: list[dict[str, Any]]
    timeout: DurationTimeout | None
    relations: list[RelationRule]
    missing_tables: list[str] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """True when some shipped table lists the code or faultmesh describes it."""
        return bool(self.levels or self.meaning)


@cache
def _knowledge() -> dict[str, Any]:
    text = resources.files("faultmesh.tables").joinpath("fault_meanings.json").read_text(encoding="utf-8")
    return json.loads(text)


def _read(rel: str, missing: list[str]) -> Any:
    try:
        return json.loads((_SERVICES_ROOT / rel).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        missing.append(rel)
        return None


def _key(code: str) -> str | int:
    """Match key: chip codes by value, switch codes by canonical spelling."""
    return code if is_switch_code(code) else int(code, 16)


def _same(spelled: Any, key: str | int) -> bool:
    try:
        return _key(canonical_code(spelled)) == key
    except ValueError:
        return False


def meaning(code: str) -> Meaning | None:
    """faultmesh's description of ``code`` (any spelling), or None. Raises ``ValueError`` when malformed."""
    key = _key(canonical_code(code))
    for spelled, m in _knowledge()["codes"].items():
        if _same(spelled, key):
            return Meaning(
                spelled,
                m["module"],
                m["name"],
                m["impact"],
                m["handling"],
                dict(m.get("zh", {})),
                m.get("source", ""),
            )
    return None


@lru_cache(maxsize=4096)
def short_name(code: str) -> str:
    """The short English name of ``code`` (``Meaning.name``; for a code a shipped table lists and
    faultmesh does not describe, what its structure says: :func:`decoded`), or "" when the code is
    unknown or is not a chip / switch code (``ManuallySeparateNPU``, node codes without a meaning).
    Never raises; cached (the fault lists of ``/v1/faults`` and ``faultmesh faults`` use it)."""
    try:
        m = meaning(code) or decoded(canonical_code(code), levels(canonical_code(code)))
    except ValueError:
        return ""
    return m.name if m is not None else nvidia_name(code)


NVIDIA_TABLE = "deviced/data/nvidiaFaultTable.json"
NVIDIA_XID_BASE = 0x4E5600000000
"""deviced's NVIDIA code space (:mod:`deviced.nvml_table`): XID n is ``NVIDIA_XID_BASE + n``, NVML
condition k is ``NVIDIA_XID_BASE + 0x10000 + k``."""
NVIDIA_END = NVIDIA_XID_BASE + 0x20000


def _nvidia_number(code: str) -> int | None:
    """The offset of ``code`` in the NVIDIA code space (XID n: n; condition k: 0x10000 + k), or None."""
    try:
        value = int(canonical_code(code), 16)
    except ValueError:
        return None
    return value - NVIDIA_XID_BASE if NVIDIA_XID_BASE <= value < NVIDIA_END else None


def device_kind(code: str, device_type: str) -> str:
    """The kind of device a fault is on, for a person: ``GPU`` for a code of the NVIDIA code space
    (deviced's nvml backend reports GPUs as device type NPU, the wire's one chip type), else
    ``device_type``."""
    return "GPU" if device_type == "NPU" and _nvidia_number(code) is not None else device_type


@lru_cache(maxsize=1024)
def nvidia_meaning(code: str) -> Meaning | None:
    """faultmesh's NVIDIA table's description of an XID or NVML-condition code (name ``Xid 79: GPU
    has fallen off the bus``; an XID the table does not list: ``Xid 999 (not in faultmesh's
    table)``, with the table's note on such XIDs), or None for any other code or when the table
    cannot be read. Never raises."""
    n = _nvidia_number(code)
    doc = _read(NVIDIA_TABLE, []) if n is not None else None
    if n is None or not isinstance(doc, dict):
        return None
    source = "faultmesh's NVIDIA table (deviced/data/nvidiaFaultTable.json, NVIDIA's Xid catalog)"
    if n < 0x10000:
        row = next((r for r in doc.get("Xids") or [] if isinstance(r, dict) and r.get("xid") == n), None)
        if row is None:
            note = str((doc.get("DefaultXid") or {}).get("note", ""))
            return Meaning(code, "GPU (Xid)", f"Xid {n} (not in faultmesh's table)", note, "", source=source)
        name = f"Xid {n}: {row.get('name', '')}"
    else:
        row = next(
            (r for r in doc.get("Conditions") or [] if isinstance(r, dict) and r.get("id") == n - 0x10000),
            None,
        )
        if row is None:
            return None
        name = str(row.get("name", ""))
    return Meaning(
        code, "GPU (Xid)" if n < 0x10000 else "GPU (NVML)", name, str(row.get("impact", "")),
        str(row.get("handling", "")), source=source,
    )  # fmt: skip


def nvidia_name(code: str) -> str:
    """:func:`nvidia_meaning`'s name, "" when there is none."""
    m = nvidia_meaning(code)
    return m.name if m is not None else ""


def level_handling(level: str) -> tuple[str, str]:
    """(English, Chinese) handling of a level name (NPU, node or switch family); ("", "") if unknown."""
    h = _knowledge()["levels"].get(level)
    return (h["handling"], h["zh"]) if h else ("", "")


def typical_faults() -> list[dict[str, Any]]:
    """The reference's typical faults by plane and module (no codes), in faultmesh's words."""
    return list(_knowledge()["typical"])


def levels(code: str, missing: list[str] | None = None) -> list[TableLevel]:
    """The level of ``code`` in every shipped table that lists it. Raises ``ValueError`` when malformed."""
    key = _key(canonical_code(code))
    missing = [] if missing is None else missing
    out: list[TableLevel] = []
    for table, (rel, inner, buckets) in _BUCKET_TABLES.items():
        doc = _read(rel, missing)
        if isinstance(doc, dict) and inner is not None:
            doc = doc.get(inner)
        if not isinstance(doc, dict):
            continue
        hits = [
            (k, lvl, c)
            for k, lvl in buckets
            for c in (doc.get(k) or [])
            if isinstance(doc.get(k), list) and _same(c, key)
        ]
        if hits:
            keys = tuple(dict.fromkeys(k for k, _, _ in hits))
            out.append(TableLevel(table, COMPONENT[table], hits[0][1], keys, str(hits[0][2])))
    sel = _read(SEL_EVENTS, missing)
    for e in (sel or {}).get("SelEvents", []) if isinstance(sel, dict) else []:
        if _same(e.get("FaultCode"), key):
            out.append(TableLevel("sel_events.json", "noded", e.get("FaultLevel", ""), (), e["FaultCode"]))
            break
    return out


def explain(code: str) -> Explanation:
    """Meaning, levels and rules of ``code`` from faultmesh's shipped defaults.

    ``frequency`` / ``duration``: the faultCustomization.json rules (as written) whose EventId holds
    the code; ``timeout``: its faultDuration.json entry; ``relations``: relation rules where it is the
    trigger or a relation fault. Raises ``ValueError`` for a malformed code.
    """
    canon = canonical_code(code)
    key = _key(canon)
    missing: list[str] = []
    lv = levels(canon, missing)
    freq: list[dict[str, Any]] = []
    dur: list[dict[str, Any]] = []
    custom = _read(CUSTOMIZATION, missing)
    if isinstance(custom, dict):
        for section, into in (("FaultFrequency", freq), ("FaultDuration", dur)):
            for rule in custom.get(section) or []:
                if isinstance(rule, dict) and any(_same(c, key) for c in rule.get("EventId") or []):
                    into.append({k: v for k, v in rule.items() if k != "EventId"})
    timeout = None
    obj = _read(DURATION, missing)
    if isinstance(obj, list):
        t = DurationTable.from_obj(obj, DURATION)
        timeout = next((e for c, e in t.timeouts.items() if _key(c) == key), None)
    relations: list[RelationRule] = []
    obj = _read(RELATION, missing)
    if isinstance(obj, list):
        relations = [
            r
            for r in RelationTable.from_obj(obj, RELATION).rules
            if _key(r.trigger) == key or any(_key(c) == key for c in r.relations)
        ]
    return Explanation(
        canon,
        is_switch_code(canon),
        meaning(canon) or _sel_meaning(key) or decoded(canon, lv) or nvidia_meaning(canon),
        lv,
        freq,
        dur,
        timeout,
        relations,
        missing,
    )


def _sel_meaning(key: str | int) -> Meaning | None:
    """noded's own SEL-derived codes carry their name in ``sel_events.json``."""
    sel = _read(SEL_EVENTS, [])
    for e in sel.get("SelEvents", []) if isinstance(sel, dict) else []:
        if _same(e.get("FaultCode"), key):
            return Meaning(
                e["FaultCode"],
                f"node {e.get('DeviceType', '')} (BMC SEL event)",
                e.get("Name", ""),
                "depends on the node's jobs",
                "by level",
                source="noded/sel_events.json",
            )
    return None


# The 9-digit public fault code convention (reference clusterd.md, publicFaultConfiguration docs):
# digit 1 the fault type, digit 2 the default level, digits 3-4 "00", digit 5 who defined it,
# digits 6-9 a number.
_PUBLIC_TYPE = {"0": "chip", "1": "node", "2": "network", "3": "storage"}
_PUBLIC_LEVEL = {"0": "NotHandleFault", "1": "SubHealthFault", "2": "SeparateNPU"}
_PUBLIC_ORIGIN = {"0": "release-defined", "1": "user-defined"}


def public_code_structure(code: str) -> Meaning | None:
    """What the structure of a 9-digit public fault code says (issue 31: 020001001, which the demo
    sends, showed "no description shipped"): its type, default level and who defined it, named as
    decoded, never as a meaning the reference does not give. None for any other code.

    ``"020001001"`` -> name ``chip public fault no. 1001``, module ``public fault: chip,
    release-defined (the reference gives no meaning)``, impact ``default level SeparateNPU ...``."""
    c = code.strip()
    if (
        len(c) != 9
        or not c.isdigit()
        or c[0] not in _PUBLIC_TYPE
        or c[1] not in _PUBLIC_LEVEL
        or c[2:4] != "00"
        or c[4] not in _PUBLIC_ORIGIN
    ):
        return None
    kind = _PUBLIC_TYPE[c[0]]
    return Meaning(
        c,
        f"public fault: {kind}, {_PUBLIC_ORIGIN[c[4]]} (the reference gives no meaning)",
        f"{kind} public fault no. {c[5:]}",
        f"default level {_PUBLIC_LEVEL[c[1]]} (the table's level applies)",
        "by level",
        source="decoded from the code: the 9-digit public fault code convention (reference clusterd.md)",
    )


def bmc_code_structure(code: str) -> Meaning | None:
    """What the structure of an iBMC alarm code says (issue 31: 0800004B, which the demo raises, had
    no description): its top byte read as the iBMC component type (:data:`faultmesh.ibmc.DEVICE_TYPES`)
    and the rest as the event number, named as decoded. The reference documents neither a meaning
    nor a layout of these codes; reading the top byte as the component is an observation (the top
    bytes of the codes its NodeDConfiguration.json lists follow that table: 0x02 disk, 0x08 PCIe
    card, 0x2C system; reference noded.md §1), so the text says so. None for a code that is not 8 hex
    digits or whose top byte the table does not name.

    ``"0800004B"`` -> name ``iBMC alarm 0x004B, top byte 0x08 (PCIe Card)``."""
    c = code.strip().upper()
    if len(c) != 8 or any(ch not in "0123456789ABCDEF" for ch in c):
        return None
    kind = DEVICE_TYPES.get(int(c[:2], 16))
    if kind is None or kind == UNKNOWN_TYPE:
        return None
    return Meaning(
        c,
        f"node hardware, iBMC component type {kind} by the code's top byte (the reference gives no meaning)",
        f"iBMC alarm 0x{c[4:]}, top byte 0x{c[:2]} ({kind})",
        "the level's (the alarm's own device type and index name the part; check it in the iBMC's alarm list)",
        "by level",
        source="decoded from the code: top byte as the iBMC device-type table (an observation, reference noded.md §1)",
    )


def decoded(code: str, table_levels: list[TableLevel]) -> Meaning | None:
    """What ``code``'s structure says when no meaning is shipped, only for a code a shipped table
    lists (``table_levels``, :func:`levels`): a 9-digit public code (:func:`public_code_structure`)
    or a code of noded's iBMC table (:func:`bmc_code_structure`); else None."""
    if not table_levels:
        return None
    if any(t.table == "NodeDConfiguration.json" for t in table_levels):
        return bmc_code_structure(code)
    return public_code_structure(code)
