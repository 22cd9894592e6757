"""deviced's fault state machine: events in, per-device codes, levels and health out. No I/O.

Everything is driven by an injected clock (``clock() -> ms``) so tests can walk hours in microseconds.
Sources: reference deviced.md §1.1 (callback handling, 1 s recover delay, mend rules, card drop),
§2 (network codes, 20 s / 60 s link-down rule), §3 (levels, precedence, Health / NetworkHealth),
§4.2 (frequency), §4.3 (duration, incl. the HBM/AIC pairing when 80E01801 has a duration rule).
faultmesh differences (design.md): the gateway probe feeds the
20 s rule through the synthetic network code ``GATEWAY_PROBE``; unknown codes are kept, marked
``unknown`` and counted; each code's own level is the max of its table level and its own escalations.

Typical use (the deviced app does this)::

    eng = FaultEngine(FaultCodeTable.load(), Customization.load())
    eng.set_devices(dcmi.devices())
    eng.submit(DeviceEvent(logic, code, OCCUR, severity, eng.now()))   # from the loop, per callback
    for logic in eng.devices: reason = eng.mend_reason(logic); ...; eng.apply_poll(logic, codes)
    changed = eng.cycle()                                                # every ~1 s when triggered
"""

from __future__ import annotations

import bisect
import collections
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from deviced.tables import (
    CARD_DROP,
    GATEWAY_PROBE,
    NETWORK_CODES_ALL,
    RESET_FINISHED,
    Customization,
    FaultCodeTable,
)
from faultmesh.dcmi.api import DeviceIds
from faultmesh.levels import NpuLevel
from faultmesh.log import event
from faultmesh.model import now_ms

log = logging.getLogger("deviced.engine")

RECOVER, OCCUR, ONCE = 0, 1, 2
ASSERTION_NAMES = {RECOVER: "recover", OCCUR: "occur", ONCE: "once"}
RECOVER_DELAY_MS = 1_000  # §1.1: the driver's error list lags the recover event
SUBSCRIBE_TO_POLL_MS = 5 * 60_000  # §1.1: unhealthy for more than 5 min -> mend by polling
HBM_DOUBLE_BIT = 0x80E01801
AIC_BUS_CODES = frozenset({0x80C98009, 0x80CB8009})
HBM_PAIR_WINDOW_MS = 5_000  # §4.3: AIC/AIV bus faults within ±5 s of an HBM double-bit fault
MAX_CODES_PER_DEVICE = 512  # active codes kept per chip (the driver lists at most 128)
MAX_EVENT_MEMORY = 2048  # per-chip last-event entries before inactive codes are forgotten

FREQUENCY = "FaultFrequency"
DURATION = "FaultDuration"


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One fault event for a chip: ``logic`` id, ``code``, ``assertion`` (0 recover, 1 occur, 2 once),
    ``severity`` (0..3; None unknown), ``time_ms`` (host time, ms), ``origin`` (callback, poll, probe,
    card-drop)."""

    logic: int
    code: int
    assertion: int
    severity: int | None
    time_ms: int
    origin: str = "callback"


@dataclass
class CodeState:
    """An active code on a chip: first-seen time (ms), last severity, ``once`` (lives one cycle)."""

    first_seen_ms: int
    severity: int | None
    once: bool = False


@dataclass
class DurationState:
    """§4.3 state per (code, chip): timed out or not, the event queue, and the alarm time (ms)."""

    timed_out: bool = False
    queue: list[tuple[int, int]] = field(default_factory=list)  # (time_ms, assertion)
    alarm_ms: int = 0


@dataclass
class FrequencyState:
    """§4.2 state per (code, chip): occurrence times (ms), last fault and last recover times."""

    times: list[int] = field(default_factory=list)
    last_fault_ms: int = 0
    last_recover_ms: int = 0


@dataclass
class UpgradeReason:
    """An escalation kept for a chip: ``code``, ``level``, ``kind`` (FaultFrequency / FaultDuration), ``time_ms``."""

    code: int
    level: NpuLevel
    kind: str
    time_ms: int


@dataclass
class Device:
    """Everything deviced knows about one chip, keyed by logic id."""

    ids: DeviceIds
    chip: dict[int, CodeState] = field(default_factory=dict)
    network: dict[int, CodeState] = field(default_factory=dict)
    duration: dict[int, DurationState] = field(default_factory=dict)
    frequency: dict[int, FrequencyState] = field(default_factory=dict)
    reasons: dict[tuple[int, str], UpgradeReason] = field(default_factory=dict)
    manually_separated: bool = False
    reinit: bool = True  # first cycle after start mends by polling
    card_dropped: bool = False
    probe_bad: bool = False
    alarm_ms: int = 0
    in_use: bool = False
    level: NpuLevel | None = None
    network_level: NpuLevel | None = None
    health: str = "Healthy"
    network_health: str = "Healthy"
    resetting: bool = False
    hbm_times: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=64))
    last_event_ms: dict[int, tuple[int, float, int]] = field(
        default_factory=dict
    )  # code -> (time, seq) last applied

    def codes(self) -> dict[int, CodeState]:
        """Chip and network codes together."""
        return {**self.chip, **self.network}


class TokenBucket:
    """A token bucket: ``capacity`` tokens, refilled at ``per_minute`` / 60 per second (clock in ms)."""

    def __init__(
        self, per_minute: int, capacity: int | None = None, clock: Callable[[], int] = now_ms
    ) -> None:
        self.rate_per_ms = per_minute / 60_000
        self.capacity = float(capacity if capacity is not None else per_minute)
        self.tokens = self.capacity
        self.clock = clock
        self.last = clock()

    def take(self) -> bool:
        """Take one token; False when the bucket is empty."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate_per_ms)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class FaultEngine:
    """Per-chip fault state (see module docstring). ``stats`` counts events by outcome."""

    def __init__(
        self,
        table: FaultCodeTable,
        custom: Customization,
        clock: Callable[[], int] = now_ms,
        recover_delay_ms: int = RECOVER_DELAY_MS,
    ) -> None:
        self.table = table
        self.custom = custom
        self.clock = clock
        self.recover_delay_ms = recover_delay_ms
        self.devices: dict[int, Device] = {}
        self.subscribe_failed = False
        self.stats: collections.Counter[str] = collections.Counter()
        self.levels_by_event: collections.Counter[tuple[str, str]] = collections.Counter()
        # (due_ms, arrival order, unique id, event), sorted; poll events share the order of their read
        self._pending: list[tuple[int, float, int, DeviceEvent]] = []
        self._uid = 0
        self._seq = 0
        self._clear_freq: dict[int, int] = {}
        self.on_reason_change: Callable[[Device, UpgradeReason, bool], None] | None = None

    def now(self) -> int:
        """The engine clock (ms)."""
        return self.clock()

    # -- devices ------------------------------------------------------------------------------
    def set_devices(self, ids: Iterable[DeviceIds]) -> None:
        """Adopt the device list; known chips keep their state, vanished chips are dropped."""
        new = {}
        for i in ids:
            d = self.devices.get(i.logic)
            if d is None:
                d = Device(i)
            else:
                d.ids = i
            new[i.logic] = d
        self.devices = new

    def set_in_use(self, logics: Iterable[int]) -> None:
        """Mark the chips a job uses (PreSeparateNPU keeps them Healthy, §3.3)."""
        used = set(logics)
        for logic, d in self.devices.items():
            d.in_use = logic in used

    # -- input --------------------------------------------------------------------------------
    def begin_poll(self, logic: int) -> tuple[int, float]:
        """Call right before reading a chip's error codes: takes it out of the re-init set (a callback
        overflow during the read puts it back) and returns the (time ms, arrival order) mark to pass
        to :meth:`apply_poll`."""
        d = self.devices.get(logic)
        if d is not None:
            d.reinit = False
        return self.now(), self._seq + 0.5

    def submit(self, ev: DeviceEvent, order: float | None = None) -> bool:
        """Queue one event. Returns False (counted) for event id 0, an unknown chip or a bad assertion.

        0x8C2FA009 (reset finished) only marks the chip for re-polling. Recovers are due 1 s later.
        """
        if ev.code == 0:
            self.stats["ignored_event_id_0"] += 1
            return False
        d = self.devices.get(ev.logic)
        if d is None:
            self.stats["rejected_unknown_device"] += 1
            return False
        if ev.assertion not in (RECOVER, OCCUR, ONCE):
            self.stats["rejected_bad_assertion"] += 1
            return False
        if ev.code == RESET_FINISHED:
            d.reinit = True
            self.stats["reset_finished"] += 1
            return True
        due = ev.time_ms + (
            self.recover_delay_ms if ev.assertion == RECOVER and ev.origin == "callback" else 0
        )
        if self.custom.duration_rule(HBM_DOUBLE_BIT) is not None:  # §4.3 HBM/AIC pairing
            if ev.code == HBM_DOUBLE_BIT and ev.assertion != RECOVER:
                d.hbm_times.append(ev.time_ms)
            elif ev.code in AIC_BUS_CODES and ev.assertion != RECOVER:
                due = max(due, ev.time_ms + HBM_PAIR_WINDOW_MS)  # held back, decided when due
        self._seq += 1
        self._uid += 1
        bisect.insort(self._pending, (due, self._seq if order is None else order, self._uid, ev))
        self.stats[f"events_{ev.origin}"] += 1
        return True

    def mark_reinit(self, logic: int) -> None:
        """Put a chip in the re-init set: its codes are re-polled next cycle (§1.1)."""
        d = self.devices.get(logic)
        if d is not None:
            d.reinit = True

    def mend_reason(self, logic: int) -> str | None:
        """Why this chip's codes must be polled this cycle, or None (§1.1 mend rules)."""
        d = self.devices.get(logic)
        if d is None:
            return None
        if d.reinit:
            return "re-init"
        if self.subscribe_failed:
            return "subscription failed"
        if d.health != "Healthy" and d.alarm_ms and self.now() - d.alarm_ms > SUBSCRIBE_TO_POLL_MS:
            return "unhealthy for more than 5 min"
        return None

    def apply_poll(self, logic: int, codes: Iterable[int], at: tuple[int, float] | None = None) -> int:
        """Diff a polled error-code list (card drop included by the caller) against the cache and
        queue synthetic occur/recover events. ``at`` is :meth:`begin_poll`'s mark taken before the read
        (default: now): the synthetic events are ordered there, so a callback that arrives during the read is
        newer and still wins. Returns the number of events made."""
        d = self.devices.get(logic)
        if d is None:
            return 0
        if at is None:
            at = self.begin_poll(logic)
        now, order = at
        live = {c for c in codes if c and c not in (RESET_FINISHED, GATEWAY_PROBE)}
        # what the cache holds once the events queued before the read are applied, in order
        expected = {c for c, st in d.codes().items() if not st.once}
        queued = sorted(((e.time_ms, seq, uid), e) for _, seq, uid, e in self._pending if e.logic == logic)
        last = dict(d.last_event_ms)
        for key, ev in (x for x in queued if x[0][:2] <= (now, order)):
            if ev.code in last and key < last[ev.code]:
                continue  # will be skipped as stale by cycle(): it does not change the cache
            last[ev.code] = key
            if ev.assertion == OCCUR:
                expected.add(ev.code)
            elif ev.assertion == RECOVER:
                expected.discard(ev.code)
        expected.discard(GATEWAY_PROBE)
        n = 0
        for c in sorted(live - expected):
            n += self.submit(DeviceEvent(logic, c, OCCUR, 0, now, "poll"), order)
        for c in sorted(expected - live):
            n += self.submit(DeviceEvent(logic, c, RECOVER, 0, now, "poll"), order)
        return n

    def set_card_drop(self, logic: int, dropped: bool) -> bool:
        """Health returned -8012 (``dropped``) or not: make the 40F84E00 occur / recover once (§1.1)."""
        d = self.devices.get(logic)
        if d is None or d.card_dropped == dropped:
            return False
        d.card_dropped = dropped
        self.submit(
            DeviceEvent(logic, CARD_DROP, OCCUR if dropped else RECOVER, None, self.now(), "card-drop")
        )
        event(
            log,
            logging.WARNING if dropped else logging.INFO,
            "card drop" if dropped else "card back",
            logic_id=logic,
            phy_id=d.ids.phy,
        )
        return True

    def set_probe(self, logic: int, healthy: bool) -> bool:
        """Feed one gateway-probe result; a change makes the GATEWAY_PROBE occur / recover."""
        d = self.devices.get(logic)
        if d is None or d.probe_bad == (not healthy):
            return False
        d.probe_bad = not healthy
        self.submit(DeviceEvent(logic, GATEWAY_PROBE, RECOVER if healthy else OCCUR, 0, self.now(), "probe"))
        return True

    # -- the cycle ----------------------------------------------------------------------------
    def cycle(self) -> set[int]:
        """Apply due events, run duration and frequency rules, recompute levels and health.

        Returns the logic ids whose reported view may have changed.
        """
        now = self.now()
        changed: set[int] = set()
        due = 0
        while due < len(self._pending) and self._pending[due][0] <= now:
            due += 1
        # order by event time, then by arrival (events of one callback batch share a ms stamp)
        batch = sorted(((e.time_ms, seq, uid), e) for _, seq, uid, e in self._pending[:due])
        del self._pending[:due]
        per_dev_queue: dict[tuple[int, int], list[tuple[int, int]]] = collections.defaultdict(list)
        for order, ev in batch:
            d = self.devices.get(ev.logic)
            if d is None:
                continue
            changed.add(ev.logic)
            if (
                ev.code in AIC_BUS_CODES
                and ev.assertion != RECOVER
                and self.custom.duration_rule(HBM_DOUBLE_BIT) is not None
                and any(abs(t - ev.time_ms) <= HBM_PAIR_WINDOW_MS for t in d.hbm_times)
            ):
                self.stats["aic_fault_paired_with_hbm"] += 1  # a consequence of the HBM fault: discarded
                continue
            last = d.last_event_ms.get(ev.code)
            if last is not None and order < last:
                self.stats["stale_event"] += 1  # an older event arriving late (e.g. a delayed recover)
                continue
            d.last_event_ms[ev.code] = order
            self._apply(d, ev)
            if self.custom.duration_rule(ev.code) is not None:
                per_dev_queue[(ev.logic, ev.code)].append((ev.time_ms, ev.assertion))
        for (logic, code), q in per_dev_queue.items():
            d = self.devices[logic]
            st = d.duration.setdefault(code, DurationState())
            for t, a in q:  # a one-off notice is an occurrence that ends at once
                st.queue.extend([(t, OCCUR), (t, RECOVER)] if a == ONCE else [(t, a)])
        for logic, d in self.devices.items():
            if self._run_duration(d, now) | self._run_frequency(d, now):
                changed.add(logic)
            if self._levels(d):
                changed.add(logic)
        # end of cycle: once codes leave, fired frequency counters clear (§1.2 step 8)
        for logic, d in self.devices.items():
            gone = False
            for store in (d.chip, d.network):
                for c in [c for c, s in store.items() if s.once]:
                    del store[c]
                    gone = True
            if gone:
                changed.add(logic)
                self._levels(d)
            if len(d.last_event_ms) > MAX_EVENT_MEMORY:  # bounded memory under a flood of distinct codes
                live = d.codes()
                d.last_event_ms = {c: o for c, o in d.last_event_ms.items() if c in live}
        for logic, code in self._clear_freq.items():
            d = self.devices.get(logic)
            if d is not None and code in d.frequency:
                d.frequency[code].times.clear()
        self._clear_freq.clear()
        return changed

    def _apply(self, d: Device, ev: DeviceEvent) -> None:
        store = d.network if ev.code in NETWORK_CODES_ALL else d.chip
        has_duration = self.custom.duration_rule(ev.code) is not None
        freq_rule = self.custom.frequency_rule(ev.code)
        if ev.assertion in (OCCUR, ONCE):
            cur = store.get(ev.code)
            if cur is None and len(d.chip) + len(d.network) >= MAX_CODES_PER_DEVICE:
                self.stats["rejected_too_many_codes"] += 1  # a driver flooding distinct codes
                return
            if cur is None:
                store[ev.code] = CodeState(ev.time_ms, ev.severity, once=ev.assertion == ONCE)
                d.alarm_ms = ev.time_ms
            else:
                self.stats["duplicate_occur"] += 1
                if ev.severity is not None:
                    cur.severity = ev.severity
                cur.once = cur.once and ev.assertion == ONCE
            if freq_rule is not None and not has_duration:
                fs = d.frequency.setdefault(ev.code, FrequencyState())
                fs.times.append(ev.time_ms)
                fs.last_fault_ms = ev.time_ms
                event(
                    log,
                    logging.INFO,
                    "insert fault frequency success",
                    logic_id=d.ids.logic,
                    code=self.table.spelling(ev.code),
                    count=len(fs.times),
                )
            level, unknown = self._code_level(ev.code, store[ev.code].severity)
            self.levels_by_event[(ev.origin, level.name)] += 1
            if unknown:
                self.stats["unknown_code"] += 1
        else:
            if store.pop(ev.code, None) is None:
                self.stats["recover_without_occur"] += 1
            if freq_rule is not None and not has_duration:
                d.frequency.setdefault(ev.code, FrequencyState()).last_recover_ms = ev.time_ms
            self.levels_by_event[(ev.origin, "Recover")] += 1

    def _code_level(self, code: int, severity: int | None) -> tuple[NpuLevel, bool]:
        if code in NETWORK_CODES_ALL:
            if code == GATEWAY_PROBE and not self.table.known(code):
                return NpuLevel.NotHandleFault, False  # the probe starts like a link down (§2)
            return self.table.network_code_level(code)
        return self.table.chip_code_level(code, severity)

    # -- §4.3 duration ------------------------------------------------------------------------
    def _run_duration(self, d: Device, now: int) -> bool:
        changed = False
        for code, st in list(d.duration.items()):
            rule = self.custom.duration_rule(code)
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
                        self._duration_flip(d, code, rule.level, st.alarm_ms, True)
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
                    self._duration_flip(d, code, rule.level, t_rec, False)
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

    def _duration_flip(self, d: Device, code: int, level: NpuLevel, t: int, timed_out: bool) -> None:
        fs = d.frequency.setdefault(code, FrequencyState()) if self.custom.frequency_rule(code) else None
        name = self.table.spelling(code)
        if timed_out:
            self._set_reason(d, UpgradeReason(code, level, DURATION, t))
            if fs is not None:
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
            self._drop_reason(d, code, DURATION)
            if fs is not None:
                fs.last_recover_ms = t
            event(log, logging.INFO, "fault duration recovered", logic_id=d.ids.logic, code=name)

    # -- §4.2 frequency -----------------------------------------------------------------------
    def _run_frequency(self, d: Device, now: int) -> bool:
        changed = False
        for code, fs in list(d.frequency.items()):
            rule = self.custom.frequency_rule(code)
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
                        code=self.table.spelling(code),
                        times=len(fs.times),
                        fault_level=rule.level.name,
                    )
                self._set_reason(d, UpgradeReason(code, rule.level, FREQUENCY, fs.last_fault_ms))
                self._clear_freq[d.ids.logic] = code
                changed = True
            elif (
                key in d.reasons
                and fs.last_recover_ms >= fs.last_fault_ms
                and rule.release_s is not None
                and now - fs.last_recover_ms > rule.release_s * 1000
            ):
                self._drop_reason(d, code, FREQUENCY)
                event(
                    log,
                    logging.INFO,
                    "fault frequency released",
                    logic_id=d.ids.logic,
                    code=self.table.spelling(code),
                )
                changed = True
            elif key in d.reasons:
                if fs.times:
                    d.reasons[key].time_ms = fs.last_fault_ms
                fs.times.clear()
            if not fs.times and key not in d.reasons and fs.last_recover_ms >= fs.last_fault_ms:
                if code not in d.codes() and code not in d.duration:
                    del d.frequency[code]
        d.manually_separated = any(r.level == NpuLevel.ManuallySeparateNPU for r in d.reasons.values())
        return changed

    def _set_reason(self, d: Device, r: UpgradeReason) -> None:
        key = (r.code, r.kind)
        new = key not in d.reasons
        d.reasons[key] = r
        if new and self.on_reason_change is not None:
            self.on_reason_change(d, r, True)

    def _drop_reason(self, d: Device, code: int, kind: str) -> None:
        r = d.reasons.pop((code, kind), None)
        if r is not None and self.on_reason_change is not None:
            self.on_reason_change(d, r, False)

    def release_manual(self, logic: int) -> bool:
        """Operator release: drop the chip's ManuallySeparateNPU reasons (§4.2 "Operator deletion")."""
        d = self.devices.get(logic)
        if d is None:
            return False
        keys = [k for k, r in d.reasons.items() if r.level == NpuLevel.ManuallySeparateNPU]
        for code, kind in keys:
            self._drop_reason(d, code, kind)
            if code in d.frequency:
                d.frequency[code].times.clear()
        d.manually_separated = False
        self._levels(d)
        return bool(keys)

    def reload(self, table: FaultCodeTable | None = None, custom: Customization | None = None) -> int:
        """Adopt new tables (§4.2 "Re-applying the config"): escalations are re-levelled to their
        rule's new FaultHandling, or dropped when the rule is gone. Returns the number of reasons changed."""
        if table is not None:
            self.table = table
        if custom is None:
            return 0
        self.custom = custom
        n = 0
        for d in self.devices.values():
            for (code, kind), r in list(d.reasons.items()):
                rule = (
                    custom.frequency_rule(code)
                    if kind == FREQUENCY
                    else custom.duration_rule(code)
                    if kind == DURATION
                    else None
                )
                if kind not in (FREQUENCY, DURATION):
                    continue
                if rule is None:
                    self._drop_reason(d, code, kind)
                    n += 1
                elif rule.level != r.level:
                    r.level = rule.level
                    n += 1
            d.manually_separated = any(r.level == NpuLevel.ManuallySeparateNPU for r in d.reasons.values())
            self._levels(d)
        return n

    # -- persistence (the reference keeps UpgradeFaultReason in its ConfigMap, §4.2, §10) --------
    PERSISTED_KINDS = (FREQUENCY, "HotResetFailed")

    def export_state(self) -> dict:
        """Escalations that must survive a restart, keyed by physical id: FaultFrequency and
        HotResetFailed reasons plus frequency counters. Duration reasons are re-derived from live codes."""
        devices = {}
        for d in self.devices.values():
            reasons = [
                {"code": r.code, "level": r.level.name, "kind": r.kind, "time_ms": r.time_ms}
                for r in d.reasons.values()
                if r.kind in self.PERSISTED_KINDS
            ]
            freq = {
                str(code): {
                    "times": fs.times,
                    "last_fault_ms": fs.last_fault_ms,
                    "last_recover_ms": fs.last_recover_ms,
                }
                for code, fs in d.frequency.items()
                if fs.times or (code, FREQUENCY) in d.reasons
            }
            if reasons or freq:
                devices[str(d.ids.phy)] = {
                    "reasons": sorted(reasons, key=lambda r: (r["code"], r["kind"])),
                    "frequency": freq,
                }
        return {"version": 1, "devices": devices}

    def import_state(self, data: dict) -> int:
        """Restore :meth:`export_state` output (unknown chips and bad entries skipped and counted).
        FaultFrequency reasons are re-levelled to the current rule or dropped when the rule is gone; a
        code not recovered before the restart counts as recovered at restart time (a still-active code
        is re-raised by the first poll). Returns the number of reasons restored."""
        by_phy = {d.ids.phy: d for d in self.devices.values()}
        now = self.now()
        n = 0
        for phy_s, entry in (data.get("devices") or {}).items():
            try:
                d = by_phy.get(int(phy_s))
            except (TypeError, ValueError):
                d = None
            if d is None or not isinstance(entry, dict):
                self.stats["restore_skipped"] += 1
                continue
            for code_s, fs in (entry.get("frequency") or {}).items():
                try:
                    st = FrequencyState(
                        [int(t) for t in fs.get("times", [])],
                        int(fs["last_fault_ms"]),
                        int(fs["last_recover_ms"]),
                    )
                    code = int(code_s)
                except (KeyError, TypeError, ValueError, AttributeError):
                    self.stats["restore_skipped"] += 1
                    continue
                if self.custom.frequency_rule(code) is None:
                    continue
                if st.last_recover_ms < st.last_fault_ms:
                    st.last_recover_ms = now
                d.frequency[code] = st
            for r in entry.get("reasons") or []:
                try:
                    code, kind, t = int(r["code"]), str(r["kind"]), int(r["time_ms"])
                    level = NpuLevel.parse(str(r["level"]))
                except (KeyError, TypeError, ValueError):
                    self.stats["restore_skipped"] += 1
                    continue
                if kind == FREQUENCY:
                    rule = self.custom.frequency_rule(code)
                    if rule is None:
                        continue
                    level = rule.level
                    d.frequency.setdefault(code, FrequencyState(last_fault_ms=t, last_recover_ms=now))
                elif kind not in self.PERSISTED_KINDS:
                    continue
                d.reasons[(code, kind)] = UpgradeReason(code, level, kind, t)
                n += 1
            d.manually_separated = any(r.level == NpuLevel.ManuallySeparateNPU for r in d.reasons.values())
            self._levels(d)
        return n

    # -- §3 levels ----------------------------------------------------------------------------
    def code_level(self, d: Device, code: int) -> NpuLevel:
        """A code's reported level: its table level (or fallback) merged with its own escalations."""
        st = d.codes().get(code)
        base = self._code_level(code, st.severity if st else 0)[0]
        for (c, _kind), r in d.reasons.items():
            if c == code and r.level > base:
                base = r.level
        return base

    def _levels(self, d: Device) -> bool:
        chip = [self.code_level(d, c) for c in d.chip]
        net = [self.code_level(d, c) for c in d.network]
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

    def worst_level(self, d: Device) -> NpuLevel | None:
        """The worse of the chip and network levels (None: no fault)."""
        levels = [x for x in (d.level, d.network_level) if x is not None]
        return max(levels) if levels else None
