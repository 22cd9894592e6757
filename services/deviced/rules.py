"""The escalation rules of deviced's engine: §4.3 fault duration, §4.2 fault frequency, re-levelling
after a table reload, and the persisted escalations (reference deviced.md §4.2, §4.3, §10).

These functions are the engine's own rules, split out of :mod:`deviced.engine` to keep it readable:
they change a :class:`deviced.state.Device` and report escalations through the engine's reason
API (``set_reason`` / ``drop_reason``, which fire the engine's ``on_reason_change`` hook). The 20 s /
60 s link-down rule of §2 is a duration rule on 81078603 (and the gateway probe's synthetic code),
so it runs here too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from deviced.state import (
    DURATION,
    FREQUENCY,
    HOT_RESET_FAILED,
    OCCUR,
    ONCE,
    RECOVER,
    CodeState,
    Device,
    DeviceEvent,
    DurationState,
    FrequencyState,
    UpgradeReason,
)
from deviced.tables import GATEWAY_PROBE, LINK_DOWN, NETWORK_CODES_ALL
from faultmesh.levels import NpuLevel
from faultmesh.log import event

if TYPE_CHECKING:
    from deviced.rulehost import RuleHost
    from deviced.tables import Customization

log = logging.getLogger("deviced.engine")

PERSISTED_KINDS = (FREQUENCY, HOT_RESET_FAILED)
RESTART_GRACE_MS = 10_000  # a code active before a restart and missing since is held this long


def update_manual(d: Device) -> None:
    """Recompute ``d.manually_separated`` from its reasons."""
    d.manually_separated = any(r.level == NpuLevel.ManuallySeparateNPU for r in d.reasons.values())


# -- one event, §3 levels -------------------------------------------------------------------------
def apply_event(eng: RuleHost, d: Device, ev: DeviceEvent) -> None:
    """Apply one due event to the chip's code cache (occur / once / recover) and feed the frequency
    counter with DISTINCT occurrences only: an occur of a code the chip does not carry. A duplicate
    occur of a still-active fault (or of one restored from the state file, :func:`restore_code`) is
    counted in ``stats["duplicate_occur"]`` and changes no rule (faultmesh's deliberate difference
    from the reference, which counts every notice: docs/compatibility.md)."""
    store = d.network if ev.code in NETWORK_CODES_ALL else d.chip
    has_duration = eng.custom.duration_rule(ev.code) is not None
    freq_rule = eng.custom.frequency_rule(ev.code)
    if ev.assertion in (OCCUR, ONCE):
        cur = store.get(ev.code)
        if cur is None and len(d.chip) + len(d.network) >= eng.max_codes:
            eng.stats["rejected_too_many_codes"] += 1  # a driver flooding distinct codes
            return
        distinct = cur is None
        if cur is None:
            store[ev.code] = CodeState(ev.time_ms, ev.severity, once=ev.assertion == ONCE)
            d.alarm_ms = ev.time_ms
        else:
            eng.stats["duplicate_occur"] += 1
            if cur.restored:  # the first report since the restart of a fault active before it
                cur.restored = False
                eng.stats["rereport_after_restart"] += 1
            cur.dup_ms = ev.time_ms
            if ev.severity is not None:
                cur.severity = ev.severity
            cur.once = cur.once and ev.assertion == ONCE
        if freq_rule is not None and not has_duration:
            if distinct:
                _count(eng, d, ev.code, ev.time_ms)
            if ev.assertion == ONCE:  # a one-off notice ends at once
                d.frequency.setdefault(ev.code, FrequencyState()).last_recover_ms = ev.time_ms
        level, unknown = eng.base_level(ev.code, store[ev.code].severity)
        eng.levels_by_event[(ev.origin, level.name)] += 1
        if unknown:
            eng.stats["unknown_code"] += 1
    else:
        if store.pop(ev.code, None) is None:
            eng.stats["recover_without_occur"] += 1
        if freq_rule is not None and not has_duration:
            d.frequency.setdefault(ev.code, FrequencyState()).last_recover_ms = ev.time_ms
        eng.levels_by_event[(ev.origin, "Recover")] += 1


def _count(eng: RuleHost, d: Device, code: int, t: int) -> None:
    """One distinct occurrence of ``code`` at ``t`` (ms) for its frequency rule."""
    fs = d.frequency.setdefault(code, FrequencyState())
    fs.times.append(t)
    fs.last_fault_ms = t
    event(
        log,
        logging.INFO,
        "insert fault frequency success",
        logic_id=d.ids.logic,
        code=eng.table.spelling(code),
        count=len(fs.times),
    )


def stale_recover(eng: RuleHost, d: Device, ev: DeviceEvent) -> None:
    """A recover that fell due after a newer occur of its code (the 1 s recover delay): the cache
    keeps the code, but the fault did recover in between, so the duplicate occur after the recover
    was a distinct occurrence: count it now (frequency rules without a duration rule)."""
    if ev.assertion != RECOVER or eng.custom.frequency_rule(ev.code) is None:
        return
    if eng.custom.duration_rule(ev.code) is not None:
        return
    cur = d.codes().get(ev.code)
    fs = d.frequency.get(ev.code)
    if cur is None or fs is None or not fs.last_fault_ms <= ev.time_ms < cur.dup_ms:
        return
    fs.last_recover_ms = ev.time_ms
    _count(eng, d, ev.code, cur.dup_ms)


def restored_held(d: Device, live: set[int], holding: bool) -> set[int]:
    """A poll of ``d`` read the ``live`` codes: each restored code it shows is seen again (the same
    occurrence: no event, its first-seen time kept); one it lacks is held (no recover) while
    ``holding`` (the restart grace runs), else left to the poll's recover, which counts once.
    Returns the held codes."""
    held = set()
    for code, st in d.codes().items():
        if not st.restored:
            continue
        if code in live or not holding:
            st.restored = False
        else:
            held.add(code)
    return held


def grace_due(eng: RuleHost) -> int | None:
    """When the running restart grace ends (engine ms), or None."""
    return eng.restore_until_ms if eng.restore_until_ms > eng.now() else None


def end_restart_grace(eng: RuleHost, now: int) -> int:
    """Once the restart grace is over (``eng.restore_until_ms`` <= ``now``, ms): each restored code of
    a polled chip that no poll nor callback showed since the restart recovered while deviced was down;
    queue its recover (at ``now``; the frequency rule sees one recover). A chip not polled yet keeps
    them until it is. Returns the recovers queued."""
    if not eng.restore_until_ms or now < eng.restore_until_ms:
        return 0
    n, left = 0, False
    for d in eng.devices.values():
        for code, st in d.codes().items():
            if st.restored and d.reinit:
                left = True
            elif st.restored:
                st.restored = False
                n += eng.submit(DeviceEvent(d.ids.logic, code, RECOVER, None, now, "restart"))
                event(log, logging.INFO, "fault recovered while deviced was down", logic_id=d.ids.logic,
                      code=eng.table.spelling(code))  # fmt: skip
    if not left:
        eng.restore_until_ms = 0
    return n


def compute_levels(eng: RuleHost, d: Device) -> bool:
    """§3: recompute the chip's level, network level, Health and NetworkHealth. True when any changed."""
    chip = [eng.code_level(d, c) for c in d.chip]
    net = [eng.code_level(d, c) for c in d.network]
    for (c, _k), r in d.reasons.items():
        (net if c in NETWORK_CODES_ALL else chip).append(r.level)
    level = max(chip) if chip else None
    network_level = max(net) if net else None
    if level is None or level <= NpuLevel.SubHealthFault:
        health = "Healthy"
    elif level == NpuLevel.PreSeparateNPU and d.in_use:
        health = "Healthy"
    else:
        health = "UnHealthy"
    network_health = (
        "Healthy" if network_level is None or network_level == NpuLevel.NotHandleFault else "UnHealthy"
    )
    old = (d.level, d.network_level, d.health, d.network_health)
    d.level, d.network_level, d.health, d.network_health = level, network_level, health, network_health
    if old[2] != health or old[3] != network_health:
        event(
            log,
            logging.INFO,
            "device health changed",
            logic_id=d.ids.logic,
            phy_id=d.ids.phy,
            health=health,
            network_health=network_health,
            fault_level=level.name if level is not None else "",
            network_level=network_level.name if network_level is not None else "",
        )
    return old != (level, network_level, health, network_health)


# -- §4.3 duration ----------------------------------------------------------------------------------
def run_duration(eng: RuleHost, d: Device, now: int) -> bool:
    """Walk each (code, chip) duration queue up to ``now`` (ms); flips raise or drop the
    FaultDuration reason. Returns True when a reason changed."""
    changed = False
    for code, st in list(d.duration.items()):
        rule = eng.custom.duration_rule(code)
        if rule is None:
            del d.duration[code]
            continue
        ft, rt = rule.fault_timeout_s * 1000, rule.recover_timeout_s * 1000
        q = sorted(st.queue, key=lambda x: x[0])  # stable: same-ms events keep their order
        merged: list[tuple[int, int]] = []
        for t, a in q:
            if not merged or merged[-1][1] != a:
                merged.append((t, a))
        q = merged
        while True:
            if not st.timed_out:
                while q and q[0][1] == RECOVER:
                    q.pop(0)
                if not q:
                    break
                t_occ = q[0][0]
                end = q[1][0] if len(q) > 1 else now
                if end - t_occ > ft:
                    st.timed_out = True
                    st.alarm_ms = t_occ + ft
                    _duration_flip(eng, d, code, rule.level, st.alarm_ms, True)
                    changed = True
                    q = q[1:]
                    continue
                if len(q) > 1:
                    q = q[2:]
                    continue
                break
            while q and q[0][1] == OCCUR:
                q.pop(0)
            if not q:
                break
            t_rec = q[0][0]
            end = q[1][0] if len(q) > 1 else now
            if end - t_rec > rt:
                st.timed_out = False
                _duration_flip(eng, d, code, rule.level, t_rec, False)
                changed = True
                q = q[1:]
                continue
            if len(q) > 1:
                q = q[2:]
                continue
            break
        st.queue = q
        if not st.timed_out and not q:
            del d.duration[code]
    return changed


def _duration_flip(eng: RuleHost, d: Device, code: int, level: NpuLevel, t: int, timed_out: bool) -> None:
    fs = d.frequency.setdefault(code, FrequencyState()) if eng.custom.frequency_rule(code) else None
    name = eng.table.spelling(code)
    if timed_out:
        eng.set_reason(d, UpgradeReason(code, level, DURATION, t))
        if fs is not None and fs.last_fault_ms == t:
            eng.stats["rereport_after_restart"] += 1  # re-derived after a restart: the same timeout
        elif fs is not None:
            fs.times.append(t)
            fs.last_fault_ms = t
        event(
            log,
            logging.WARNING,
            "fault duration timeout",
            logic_id=d.ids.logic,
            code=name,
            fault_level=level.name,
        )
    else:
        eng.drop_reason(d, code, DURATION)
        if fs is not None:
            fs.last_recover_ms = t
        event(log, logging.INFO, "fault duration recovered", logic_id=d.ids.logic, code=name)


# -- §4.2 frequency ---------------------------------------------------------------------------------
def run_frequency(eng: RuleHost, d: Device, now: int, fired: dict[int, int]) -> bool:
    """Count occurrences in each rule's window, raise / release FaultFrequency reasons. A rule that
    fired this cycle is recorded in ``fired`` (logic -> code): its counter clears at cycle end."""
    changed = False
    for code, fs in list(d.frequency.items()):
        rule = eng.custom.frequency_rule(code)
        if rule is None:
            del d.frequency[code]
            continue
        cutoff = now - rule.window_s * 1000
        fs.times = [t for t in fs.times if t >= cutoff]
        key = (code, FREQUENCY)
        if len(fs.times) >= rule.times:
            if key not in d.reasons:
                event(
                    log,
                    logging.WARNING,
                    "FaultFrequency detected",
                    logic_id=d.ids.logic,
                    code=eng.table.spelling(code),
                    times=len(fs.times),
                    fault_level=rule.level.name,
                )
            eng.set_reason(d, UpgradeReason(code, rule.level, FREQUENCY, fs.last_fault_ms, tuple(fs.times)))
            fired[d.ids.logic] = code
            changed = True
        elif (
            key in d.reasons
            and fs.last_recover_ms >= fs.last_fault_ms
            and rule.release_s is not None
            and now - fs.last_recover_ms > rule.release_s * 1000
        ):
            eng.drop_reason(d, code, FREQUENCY)
            event(
                log,
                logging.INFO,
                "fault frequency released",
                logic_id=d.ids.logic,
                code=eng.table.spelling(code),
            )
            changed = True
        elif key in d.reasons:
            if fs.times:
                d.reasons[key].time_ms = fs.last_fault_ms
            fs.times.clear()
        if not fs.times and key not in d.reasons and fs.last_recover_ms >= fs.last_fault_ms:
            if code not in d.codes() and code not in d.duration:
                del d.frequency[code]
    update_manual(d)
    return changed


def relevel(eng: RuleHost, d: Device, custom: Customization) -> int:
    """§4.2 "Re-applying the config": re-level each escalation to its rule's new FaultHandling, or
    drop it when the rule is gone. Returns the number of reasons changed."""
    n = 0
    for (code, kind), r in list(d.reasons.items()):
        if kind not in (FREQUENCY, DURATION):
            continue
        rule = custom.frequency_rule(code) if kind == FREQUENCY else custom.duration_rule(code)
        if rule is None:
            eng.drop_reason(d, code, kind)
            n += 1
        elif rule.level != r.level:
            r.level = rule.level
            n += 1
    update_manual(d)
    return n


# -- persistence (the reference keeps UpgradeFaultReason in its ConfigMap, §4.2, §10) ----------------
STATE_VERSION = 2  # 2: + the active codes ("active"); 1 is still read


def persisted_codes(d: Device) -> dict[str, dict]:
    """The active codes of ``d`` a restart must treat as the same occurrence: every driver code (not a
    one-off notice, not the gateway probe's synthetic code, not a link down only hccn_tool saw), as
    ``{"<code>": {"first_seen_ms": ms, "severity": int | None}}``."""
    return {
        str(code): {"first_seen_ms": st.first_seen_ms, "severity": st.severity}
        for code, st in d.codes().items()
        if not st.once and code != GATEWAY_PROBE and not (code == LINK_DOWN and d.link_raised)
    }


def export_state(devices: dict[int, Device]) -> dict:
    """What must survive a restart, keyed by physical id: FaultFrequency and HotResetFailed reasons,
    frequency counters and the active codes (:func:`persisted_codes`). Duration reasons are
    re-derived from the active codes' first-seen times. Shape: ``{"version": 2, "devices": {"<phy>":
    {"reasons": [...], "frequency": {...}, "active": {...}}}}``."""
    out = {}
    for d in devices.values():
        reasons = [
            {"code": r.code, "level": r.level.name, "kind": r.kind, "time_ms": r.time_ms}
            for r in d.reasons.values()
            if r.kind in PERSISTED_KINDS
        ]
        freq = {
            str(code): {
                "times": fs.times,
                "last_fault_ms": fs.last_fault_ms,
                "last_recover_ms": fs.last_recover_ms,
            }
            for code, fs in d.frequency.items()
            if fs.times or (code, FREQUENCY) in d.reasons or fs.last_recover_ms < fs.last_fault_ms
        }
        active = persisted_codes(d)
        if reasons or freq or active:
            out[str(d.ids.phy)] = {
                "reasons": sorted(reasons, key=lambda r: (r["code"], r["kind"])),
                "frequency": freq,
                "active": active,
            }
    return {"version": STATE_VERSION, "devices": out}


def restore_code(eng: RuleHost, d: Device, code: int, first_seen_ms: int, severity: int | None) -> bool:
    """Put ``code``, active when the state file was written, back on ``d`` as ``restored``: it is
    reported with its first-seen time and level, its re-report (first poll, first callback) is the
    same occurrence, and it recovers only when no poll nor callback shows it within the restart
    grace (:func:`restored_held`, :func:`expire_restored`). A duration rule's queue restarts from
    ``first_seen_ms``, so a timeout is re-derived at the same time (not counted again). False when
    the chip already carries the code or is full."""
    store = d.network if code in NETWORK_CODES_ALL else d.chip
    if code in d.codes() or len(d.chip) + len(d.network) >= eng.max_codes:
        return False
    store[code] = CodeState(first_seen_ms, severity, restored=True)
    d.alarm_ms = max(d.alarm_ms, first_seen_ms)
    if eng.custom.duration_rule(code) is not None:
        d.duration.setdefault(code, DurationState()).queue.append((first_seen_ms, OCCUR))
    return True


def import_state(eng: RuleHost, data: dict) -> int:
    """Restore :func:`export_state` output into ``eng`` (unknown chips and bad entries skipped and
    counted in ``restore_skipped``). FaultFrequency reasons are re-levelled to the current rule or
    dropped when the rule is gone. The active codes come back marked restored (:func:`restore_code`;
    a version-1 document, which has none, restores the frequency codes not recovered before the
    restart). Importing the same document again changes nothing. Returns the reasons restored.
    Raises ``ValueError`` when the document's shape is not a state file's."""
    if not isinstance(data.get("devices") or {}, dict):
        raise ValueError("devices is not a JSON object")
    by_phy = {d.ids.phy: d for d in eng.devices.values()}
    now = eng.now()
    version = data.get("version")
    n = 0
    for phy_s, entry in (data.get("devices") or {}).items():
        try:
            d = by_phy.get(int(phy_s))
        except (TypeError, ValueError):
            d = None
        if d is None or not isinstance(entry, dict):
            eng.stats["restore_skipped"] += 1
            continue
        for code_s, a in _items(entry.get("active")):
            try:
                sev = a.get("severity")
                restore_code(eng, d, int(code_s), int(a["first_seen_ms"]), None if sev is None else int(sev))
            except (KeyError, TypeError, ValueError, AttributeError):
                eng.stats["restore_skipped"] += 1
        for code_s, fs in _items(entry.get("frequency")):
            try:
                st = FrequencyState(
                    [int(t) for t in fs.get("times", [])],
                    int(fs["last_fault_ms"]),
                    int(fs["last_recover_ms"]),
                )
                code = int(code_s)
            except (KeyError, TypeError, ValueError, AttributeError):
                eng.stats["restore_skipped"] += 1
                continue
            if eng.custom.frequency_rule(code) is None:
                continue
            if (
                version == 1 and st.last_recover_ms < st.last_fault_ms
            ):  # version 1: first seen ~ the counted time
                dur = eng.custom.duration_rule(code)
                restore_code(
                    eng, d, code, st.last_fault_ms - (dur.fault_timeout_s * 1000 if dur else 0), None
                )
            d.frequency[code] = st
        for r in entry.get("reasons") if isinstance(entry.get("reasons"), list) else []:
            try:
                code, kind, t = int(r["code"]), str(r["kind"]), int(r["time_ms"])
                level = NpuLevel.parse(str(r["level"]))
            except (KeyError, TypeError, ValueError, AttributeError):
                eng.stats["restore_skipped"] += 1
                continue
            if kind == FREQUENCY:
                rule = eng.custom.frequency_rule(code)
                if rule is None:
                    continue
                level = rule.level
                d.frequency.setdefault(code, FrequencyState(last_fault_ms=t, last_recover_ms=now))
            elif kind not in PERSISTED_KINDS:
                continue
            d.reasons[(code, kind)] = UpgradeReason(code, level, kind, t)
            n += 1
        update_manual(d)
        eng.refresh(d.ids.logic)
    if any(st.restored for d in eng.devices.values() for st in d.codes().values()):
        eng.restore_until_ms = now + eng.restart_grace_ms
    return n


def _items(obj: object) -> list[tuple[str, dict]]:
    """The entries of a JSON object member (anything else: none)."""
    return list(obj.items()) if isinstance(obj, dict) else []
