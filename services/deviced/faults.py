"""The ONE place where deviced turns its state into faults (issue 12).

- :func:`chip_faults` — the engine's chips as ``Fault`` records of source ``dcmi``: one per active
  code, plus one per held escalation whose code is gone (``recovered=true``).
- :func:`switch_faults` — the switch state as ``Fault`` records of source ``lingqu`` (§7: NotHandle,
  ``during_reset=true``, while a chip reset runs).
- :func:`device_states` — one ``DeviceState`` per chip for the agent stream.

``device_id`` of a chip fault is the chip's **physical** id (the id rank tables and clusterd's job
view use); the logic id is in ``attributes["logic_id"]``.
"""

from __future__ import annotations

from dataclasses import replace

from deviced.engine import HOT_RESET_FAILED, FaultEngine, UpgradeReason
from deviced.state import DURATION, FREQUENCY
from deviced.switch import SwitchState
from deviced.tables import GATEWAY_PROBE, NETWORK_CODES_ALL
from faultmesh._pb import agent_pb2
from faultmesh.model import Fault

SOURCE = "dcmi"
SWITCH_SOURCE = "lingqu"


def plane(code: int) -> str:
    """``network`` for a network code, else ``chip``."""
    return "network" if code in NETWORK_CODES_ALL else "chip"


def code_name(engine: FaultEngine, code: int) -> str:
    """A code's spelling (hex), or HotResetFailed for the reset escalation's code 0."""
    return engine.table.spelling(code) if code else HOT_RESET_FAILED


def chip_faults(engine: FaultEngine, node: str) -> list[Fault]:
    """The chip and network faults to report (see module docstring)."""
    out = []
    now = engine.now()
    for logic, d in sorted(engine.devices.items()):
        active = d.codes()
        for code, st in sorted(active.items()):
            level, unknown = engine.base_level(code, st.severity)
            attrs = {"logic_id": str(logic), "plane": plane(code), "base_level": level.name}
            if unknown:
                attrs["unknown"] = "true"
            if code == GATEWAY_PROBE:
                attrs["signal"] = "gateway-probe"
            ups = [r for (c, _k), r in d.reasons.items() if c == code]
            if ups:
                attrs.update(why_raised(engine, code, ups))
            out.append(
                Fault(
                    source=SOURCE,
                    node=node,
                    device_type="NPU",
                    device_id=d.ids.phy,
                    code=engine.table.spelling(code),
                    level=engine.code_level(d, code).name,
                    assertion="once" if st.once else "occur",
                    first_seen_ms=st.first_seen_ms,
                    last_seen_ms=now,
                    attributes=attrs,
                )
            )
        held: dict[int, list[UpgradeReason]] = {}
        for (code, _kind), r in sorted(d.reasons.items()):
            if code not in active:
                held.setdefault(code, []).append(r)
        for code, rs in held.items():
            out.append(
                Fault(
                    source=SOURCE,
                    node=node,
                    device_type="NPU",
                    device_id=d.ids.phy,
                    code=code_name(engine, code),
                    level=max(r.level for r in rs).name,
                    first_seen_ms=min(r.time_ms for r in rs),
                    last_seen_ms=now,
                    attributes={
                        "logic_id": str(logic),
                        **why_raised(engine, code, rs),
                        "recovered": "true",
                        "plane": plane(code),
                    },
                )
            )
    return out


def why_raised(engine: FaultEngine, code: int, reasons: list[UpgradeReason]) -> dict[str, str]:
    """The attributes that say why a rule raised ``code``'s level on a chip (issue 31): ``upgrade``
    (the kinds, e.g. ``FaultFrequency``), ``upgrade_rule`` (each rule in words: "3 times in 86400 s
    -> ManuallySeparateNPU", "lasting over 20 s -> PreSeparateNPU") and ``upgrade_occurrences_ms``
    (the occurrence times, ms since the epoch, that the frequency rule counted)."""
    out = {"upgrade": ",".join(sorted(r.kind for r in reasons))}
    rules = []
    for r in sorted(reasons, key=lambda r: r.kind):
        if r.kind == FREQUENCY and (rule := engine.custom.frequency_rule(code)) is not None:
            rules.append(f"{r.kind}: {rule.times} times in {rule.window_s} s -> {r.level.name}")
            if r.occurrences:
                out["upgrade_occurrences_ms"] = ",".join(str(t) for t in r.occurrences)
        elif r.kind == DURATION and (rule := engine.custom.duration_rule(code)) is not None:
            rules.append(f"{r.kind}: lasting over {rule.fault_timeout_s} s -> {r.level.name}")
        else:
            rules.append(f"{r.kind} -> {r.level.name}")
    out["upgrade_rule"] = "; ".join(rules)
    return out


def switch_faults(switch: SwitchState, node: str, during_reset: bool) -> list[Fault]:
    """The switch faults; while a chip reset runs (``during_reset``) reported as NotHandle (§7)."""
    sw = switch.faults(node)
    if during_reset:
        sw = [replace(f, level="NotHandle", attributes={**f.attributes, "during_reset": "true"}) for f in sw]
    return sw


def device_states(engine: FaultEngine, spod: dict[int, tuple[int, int]]) -> list[agent_pb2.DeviceState]:
    """One DeviceState per chip: logic id, physical id, health, worst level, super-pod placement."""
    out = []
    for logic, d in engine.devices.items():
        sp = spod.get(logic, (-2, -2))
        worst = d.worst_level()
        out.append(
            agent_pb2.DeviceState(
                device_type="NPU",
                device_id=logic,
                phy_id=d.ids.phy,
                health=d.health,
                network_health=d.network_health,
                level=worst.name if worst is not None else "",
                super_pod_id=sp[0],
                server_index=sp[1],
            )
        )
    return out
