"""BMC readings -> faults: the iBMC OEM alarms and the active SEL events as :class:`Fault` records.

Source: reference noded.md §1–3. Codes are levelled by the NodeD level table
(:class:`noded.levels.LevelTable`); an OEM code not in it is NotHandleFault with attribute
``unknown=true``; a SEL event takes the SEL table's level unless the level table lists its code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from faultmesh.model import Fault
from noded.bmc import oem, sel
from noded.levels import LevelTable

SOURCE_OEM = "bmc-oem"
SOURCE_SEL = "bmc-sel"


def oem_faults(alarms: Iterable[oem.AlarmRecord], table: LevelTable, node: str, now_ms: int) -> list[Fault]:
    """Current OEM alarms as faults of source ``bmc-oem`` (one per device and code, first occurrence
    wins); ``now_ms`` (epoch ms) is their first/last-seen time."""
    out: dict[tuple[str, int, str], Fault] = {}
    for a in alarms:
        key = (a.device_type, a.device_id, a.code)
        if key in out:
            continue
        level, known = table.classify(a.code)
        attrs = {"severity": str(a.severity), "type_byte": f"0x{a.type_byte:02X}"}
        if not known:
            attrs["unknown"] = "true"
        out[key] = Fault(
            SOURCE_OEM,
            node,
            a.device_type,
            a.device_id,
            a.code,
            level.name,
            first_seen_ms=now_ms,
            last_seen_ms=now_ms,
            attributes=attrs,
        )
    return list(out.values())


def sel_faults(tracker: sel.SelFaultTracker, table: LevelTable, node: str, now_ms: int) -> list[Fault]:
    """The tracker's active SEL events as faults of source ``bmc-sel``. The SEL table gives the level;
    a level-table entry for the code wins."""
    out = []
    for (dtype, num, code), (rule, bmc_ts) in tracker.active.items():
        level, known = table.classify(code)
        lv = level if known else rule.level
        attrs = {"event": rule.name, "sensor_type": f"0x{rule.sensor_type:02X}", "bmc_time": str(bmc_ts)}
        out.append(
            Fault(
                SOURCE_SEL,
                node,
                dtype,
                num,
                code,
                lv.name,
                first_seen_ms=now_ms,
                last_seen_ms=now_ms,
                attributes=attrs,
            )
        )
    return out


class PollResult:
    """What one blocking poll returned (built in the pool thread, applied on the loop)."""

    __slots__ = (
        "mode",
        "fallback",
        "transient",
        "alarms",
        "records",
        "cursor",
        "cleared",
        "device",
        "serial",
    )

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.fallback = False
        self.transient = False  # the fallback came from a transient completion code
        self.alarms: list[oem.AlarmRecord] = []
        self.records: list[sel.SelRecord] = []
        self.cursor: sel.SelCursor | None = None
        self.cleared = False
        self.device: Any = None
        self.serial: str | None = None
