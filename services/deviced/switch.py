"""Switch (lingqu) fault state: subscription events plus periodic full queries (reference deviced.md §7).

Key of one switch fault: (alarm id, fault id, peer device type, peer port, switch chip, switch port).
A Recover removes the matching fault; a full query replaces the list (Recover entries dropped).
Each fault's ``events`` attribute is the JSON list of its per-port records (:func:`switch_record`,
the reference's SimpleSwitchFaultInfo), so ClusterD publishes them as the reference's cluster-info.
Codes not in the SwitchFaultCode table are reported as NotHandle with ``unknown=true`` and counted in
``unlisted`` (design.md: unknown codes are never dropped; the reference drops them). If all 16 L1->L2
ports of one chip are down (peer type L2, Occur), that chip's faults are Separate.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import orjson

from deviced.tables import SWITCH_LEVEL_RANK, SWITCH_NODE_STATUS, SwitchFaultTable, switch_code
from faultmesh.dcmi.lingqu import SwitchEvent
from faultmesh.model import Fault, now_ms

PEER_L2 = 2
L2_PORTS_PER_CHIP = 16


def switch_record(ev: SwitchEvent, t: int) -> dict:
    """One switch fault as the reference's SimpleSwitchFaultInfo (deviced.md §7, the items of
    ``SwitchInfoCfg.FaultCode``), fields in the Go struct's order; ``t`` = AlarmRaisedTime (ms)."""
    return {
        "EventType": ev.event_type,
        "AssembledFaultCode": switch_code(ev.event_type, ev.fault_id, ev.peer_device),
        "PeerPortDevice": ev.peer_device,
        "PeerPortId": ev.peer_port,
        "SwitchChipId": ev.switch_chip,
        "SwitchPortId": ev.switch_port,
        "Severity": ev.severity,
        "Assertion": ev.assertion,
        "AlarmRaisedTime": t,
    }


EVENTS_ATTR_MAX = 4000  # ClusterD takes attribute values of up to 4096 bytes


def _events_attr(records: list[dict]) -> str:
    """The ``events`` attribute: the records as JSON, the last ones left out past 4000 bytes (a chip
    with more than ~20 ports down on one code; the fault's ``switch_ports`` still lists them all)."""
    text = orjson.dumps(records).decode()
    while len(text) > EVENTS_ATTR_MAX and len(records) > 1:
        records = records[: len(records) * EVENTS_ATTR_MAX // len(text)] or records[:1]
        text = orjson.dumps(records).decode()
    return text


class SwitchState:
    """Current switch faults. ``apply(ev, now)`` for subscription events; ``replace(events, now)`` for a
    full query; ``faults(node)`` -> list of ``Fault`` (one per (chip, code), ports listed)."""

    def __init__(self, table: SwitchFaultTable) -> None:
        self.table = table
        self.current: dict[tuple, tuple[SwitchEvent, int]] = {}
        self.unlisted: collections.Counter[str] = collections.Counter()
        self.overrides: dict[str, str] = {}  # code -> raised level (relation faults, deviced.relations)

    @staticmethod
    def key(ev: SwitchEvent) -> tuple:
        return (ev.event_type, ev.fault_id, ev.peer_device, ev.peer_port, ev.switch_chip, ev.switch_port)

    def apply(self, ev: SwitchEvent, now: int | None = None) -> bool:
        """Apply one subscribed event. Returns True when the current set changed."""
        now = now or now_ms()
        k = self.key(ev)
        if ev.assertion == 0:
            return self.current.pop(k, None) is not None
        if k in self.current:
            return False
        self.current[k] = (ev, ev.alarm_raised_time or now)
        return True

    def replace(self, events: Iterable[SwitchEvent], now: int | None = None) -> bool:
        """Make a full query the current set (Recover entries dropped); first-seen times kept."""
        now = now or now_ms()
        new = {}
        for ev in events:
            if ev.assertion == 0:
                continue
            k = self.key(ev)
            old = self.current.get(k)
            new[k] = old if old is not None else (ev, ev.alarm_raised_time or now)
        changed = set(new) != set(self.current)
        self.current = new
        return changed

    def faults(self, node: str) -> list[Fault]:
        """Graded faults (unlisted codes: NotHandle, ``unknown=true``, counted), sorted by (chip, code)."""
        l2_down: dict[int, set[int]] = collections.defaultdict(set)
        for ev, _t in self.current.values():
            if ev.peer_device == PEER_L2:
                l2_down[ev.switch_chip].add(ev.switch_port)
        groups: dict[tuple[int, str], list[tuple[SwitchEvent, int]]] = collections.defaultdict(list)
        for ev, t in self.current.values():
            groups[(ev.switch_chip, switch_code(ev.event_type, ev.fault_id, ev.peer_device))].append((ev, t))
        out = []
        for (chip, code), evs in sorted(groups.items()):
            level = self.table.level(code)
            unknown = level is None
            if unknown:  # design.md: unknown codes are reported (NotHandle, marked unknown), never dropped
                self.unlisted[code] += 1
                level = "NotHandle"
            if len(l2_down.get(chip, ())) >= L2_PORTS_PER_CHIP:
                level = "Separate"
            raised = self.overrides.get(code)
            if raised is not None and SWITCH_LEVEL_RANK[raised] > SWITCH_LEVEL_RANK[level]:
                level = raised
            first = min(t for _, t in evs)
            ports = sorted({ev.switch_port for ev, _ in evs})
            records = [switch_record(ev, t) for ev, t in sorted(evs, key=lambda x: (x[0].switch_port, x[1]))]
            out.append(
                Fault(
                    source="lingqu",
                    node=node,
                    device_type="Switch",
                    device_id=chip,
                    code=code,
                    level=level,
                    first_seen_ms=first,
                    last_seen_ms=first,
                    attributes={
                        "switch_ports": ",".join(map(str, ports)),
                        "peer_ports": ",".join(sorted({str(ev.peer_port) for ev, _ in evs})),
                        "severity": str(max(ev.severity for ev, _ in evs)),
                        # the reference's per-port records, for ClusterD's cluster-info-switch FaultCode
                        "events": _events_attr(records),
                        **({"unknown": "true"} if unknown else {}),
                        **({"upgrade": "RelationFault"} if raised is not None and raised == level else {}),
                    },
                )
            )
        return out

    def node_status(self, faults: list[Fault]) -> tuple[str, str]:
        """(FaultLevel, NodeStatus) of the switch (§7): the highest level, '' and Healthy when none."""
        if not faults:
            return "", "Healthy"
        worst = max((f.level for f in faults), key=lambda lv: SWITCH_LEVEL_RANK.get(lv, 0))
        return worst, SWITCH_NODE_STATUS[worst]
