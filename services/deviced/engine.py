"""deviced's fault state machine: events in, per-device codes, levels and health out. No I/O.

The engine is the ONLY owner of device state (issue 12): sources emit events into it through its
public methods (``submit``, ``apply_poll``, ``set_card_drop``, ``set_probe``, ``set_link``,
``mark_reinit``, ``overflowed``), actions change it through it (hot reset: ``reset_begin`` /
``reset_end`` / ``reset_failed``; operator release: ``release_manual``), and readers use
``devices`` (read only), ``code_level`` / ``base_level`` / ``worst_level`` and ``next_due_ms``.

Everything is driven by an injected clock (``clock() -> ms``) so tests can walk hours in microseconds.
Sources: reference deviced.md §1.1 (callback handling, 1 s recover delay, mend rules, card drop),
§2 (network codes, 20 s / 60 s link-down rule), §3 (levels, precedence, Health / NetworkHealth),
§4.2 (frequency), §4.3 (duration, incl. the HBM/AIC pairing when 80E01801 has a duration rule); the
frequency and duration rules themselves are in :mod:`deviced.rules`, the events waiting for their
due time (recover delay, HBM pairing) in :class:`deviced.eventqueue.EventQueue`.
faultmesh differences (design.md): the gateway probe feeds the
20 s rule through the synthetic network code ``GATEWAY_PROBE``; unknown codes are kept, marked
``unknown`` and counted; each code's own level is the max of its table level and its own escalations.

Typical use (the deviced cycle does this)::

    eng = FaultEngine(FaultCodeTable.load(), Customization.load())
    eng.set_devices(dcmi.devices())
    eng.submit(DeviceEvent(logic, code, OCCUR, severity, eng.now()))   # from the loop, per callback
    for logic in eng.devices: reason = eng.mend_reason(logic); ...; eng.apply_poll(logic, codes)
    changed = eng.cycle()                                                # every ~1 s when triggered
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any

from deviced import rules
from deviced.eventqueue import EventQueue
from deviced.state import (
    HOT_RESET_FAILED,
    MAX_CODES_PER_DEVICE,
    OCCUR,
    ONCE,
    RECOVER,
    Device,
    DeviceEvent,
    DurationState,
    UpgradeReason,
)
from deviced.tables import (
    CARD_DROP,
    GATEWAY_PROBE,
    LINK_DOWN,
    NETWORK_CODES_ALL,
    RESET_FINISHED,
    Customization,
    FaultCodeTable,
)
from faultmesh.dcmi.api import DeviceIds
from faultmesh.levels import NpuLevel
from faultmesh.log import event
from faultmesh.model import now_ms

__all__ = [
    "HOT_RESET_FAILED",
    "MAX_CODES_PER_DEVICE",
    "OCCUR",
    "ONCE",
    "RECOVER",
    "Device",
    "DeviceEvent",
    "DurationState",
    "FaultEngine",
    "UpgradeReason",
]

log = logging.getLogger("deviced.engine")

RECOVER_DELAY_MS = 1_000  # §1.1: the driver's error list lags the recover event
SUBSCRIBE_TO_POLL_MS = 5 * 60_000  # §1.1: unhealthy for more than 5 min -> mend by polling
HBM_DOUBLE_BIT = 0x80E01801
AIC_BUS_CODES = frozenset({0x80C98009, 0x80CB8009})
HBM_PAIR_WINDOW_MS = 5_000  # §4.3: AIC/AIV bus faults within ±5 s of an HBM double-bit fault
MAX_EVENT_MEMORY = 2048  # per-chip last-event entries before inactive codes are forgotten


class FaultEngine:
    """Per-chip fault state (see module docstring). The timings are ms (``recover_delay_ms`` 1 s,
    ``poll_fallback_ms`` 5 min, ``hbm_pair_window_ms`` 5 s, ``restart_grace_ms`` 10 s: see
    :func:`deviced.rules.restore_code`) and ``max_codes`` (512) caps a chip's
    active codes; deviced's flags set them (issue 20). ``stats`` counts events by outcome;
    ``levels_by_event`` counts handled events by (origin, level); ``subscribed`` is True while fault
    events come by subscription, ``subscribe_failed`` once it was given up (mend by polling)."""

    PERSISTED_KINDS = rules.PERSISTED_KINDS

    def __init__(
        self,
        table: FaultCodeTable,
        custom: Customization,
        clock: Callable[[], int] = now_ms,
        recover_delay_ms: int = RECOVER_DELAY_MS,
        poll_fallback_ms: int = SUBSCRIBE_TO_POLL_MS,
        hbm_pair_window_ms: int = HBM_PAIR_WINDOW_MS,
        max_codes: int = MAX_CODES_PER_DEVICE,
        restart_grace_ms: int = rules.RESTART_GRACE_MS,
    ) -> None:
        self.table = table
        self.custom = custom
        self.clock = clock
        self.recover_delay_ms = recover_delay_ms
        self.poll_fallback_ms = poll_fallback_ms
        self.hbm_pair_window_ms = hbm_pair_window_ms
        self.max_codes = max_codes
        self.restart_grace_ms = restart_grace_ms
        self.restore_until_ms = 0  # end of the restart grace (engine ms); 0: none running
        self.devices: dict[int, Device] = {}
        self.subscribed = False
        self.subscribe_failed = False
        self.stats: collections.Counter[str] = collections.Counter()
        self.levels_by_event: collections.Counter[tuple[str, str]] = collections.Counter()
        self._queue = EventQueue()  # events waiting for their due time
        self._clear_freq: dict[int, int] = {}
        self.on_reason_change: Callable[[Device, UpgradeReason, bool], None] | None = None
        self.stages: list[Any] = []

    def add_stage(self, stage: Any) -> None:
        """Run ``stage.run(engine, now_ms) -> changed logic ids`` in every :meth:`cycle` after the
        duration and frequency rules (e.g. :class:`deviced.relations.RelationRules`; the changed chips
        get their levels recomputed); ``stage.next_due_ms()`` joins :meth:`next_due_ms`."""
        self.stages.append(stage)

    def now(self) -> int:
        """The engine clock (ms)."""
        return self.clock()

    def next_due_ms(self) -> int | None:
        """When the earliest queued event or stage deadline falls due (engine ms), or None."""
        due = (*(s.next_due_ms() for s in self.stages), rules.grace_due(self), self._queue.first_due())
        return min((t for t in due if t is not None), default=None)

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

    def logic_of_phy(self, phy: int) -> int | None:
        """The logic id of the chip with physical id ``phy`` (None when unknown)."""
        return next((lg for lg, d in self.devices.items() if d.ids.phy == phy), None)

    def set_in_use(self, logics: Iterable[int]) -> None:
        """Mark the chips a job uses (PreSeparateNPU keeps them Healthy, §3.3)."""
        used = set(logics)
        for logic, d in self.devices.items():
            d.in_use = logic in used

    def set_subscription(self, up: bool) -> None:
        """Fault events come by subscription (``up``) or the subscription was given up (mend by polling)."""
        self.subscribed = up
        self.subscribe_failed = not up

    # -- input --------------------------------------------------------------------------------
    def begin_poll(self, logic: int) -> tuple[int, float]:
        """Call right before reading a chip's error codes: takes it out of the re-init set (a callback
        overflow during the read puts it back) and returns the (time ms, arrival order) mark to pass
        to :meth:`apply_poll`."""
        d = self.devices.get(logic)
        if d is not None:
            d.reinit = False
        return self.now(), self._queue.mark()

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
                due = max(due, ev.time_ms + self.hbm_pair_window_ms)  # held back, decided when due
        self._queue.push(due, ev, order)
        self.stats[f"events_{ev.origin}"] += 1
        return True

    def mark_reinit(self, logic: int) -> bool:
        """Put a chip in the re-init set: its codes are re-polled next cycle (§1.1). False: unknown chip."""
        d = self.devices.get(logic)
        if d is not None:
            d.reinit = True
        return d is not None

    def overflowed(self, logic: int) -> None:
        """A callback for ``logic`` was dropped (rate limit): re-poll the chip (an unknown one is counted)."""
        if not self.mark_reinit(logic):
            self.stats["rejected_unknown_device"] += 1

    def mend_reason(self, logic: int) -> str | None:
        """Why this chip's codes must be polled this cycle, or None (§1.1 mend rules)."""
        d = self.devices.get(logic)
        if d is None:
            return None
        if d.reinit:
            return "re-init"
        if self.subscribe_failed:
            return "subscription failed"
        if d.health != "Healthy" and d.alarm_ms and self.now() - d.alarm_ms > self.poll_fallback_ms:
            return "unhealthy for more than 5 min"
        return None

    def apply_poll(
        self,
        logic: int,
        codes: Iterable[int],
        at: tuple[int, float] | None = None,
        card_dropped: bool | None = None,
    ) -> int:
        """Diff a polled error-code list against the cache and queue synthetic occur/recover events.

        ``at`` is :meth:`begin_poll`'s mark taken before the read (default: now): the synthetic events
        are ordered there, so a callback that arrives during the read is newer and still wins.
        ``card_dropped`` (the health read of the same poll: True on -8012, False when it answered,
        None unknown) adds or removes the card-drop code 40F84E00; a link down raised by hccn_tool
        (:meth:`set_link`) stays live (it is not in the driver's list). Returns the number of events made."""
        d = self.devices.get(logic)
        if d is None:
            return 0
        if at is None:
            at = self.begin_poll(logic)
        now, order = at
        codes = list(codes)
        if card_dropped is not None:
            d.card_dropped = card_dropped
            if card_dropped:
                codes.append(CARD_DROP)
        if d.link_raised:
            codes.append(LINK_DOWN)
        live = {c for c in codes if c and c not in (RESET_FINISHED, GATEWAY_PROBE)}
        held = rules.restored_held(d, live, now < self.restore_until_ms)
        # what the cache holds once the events queued before the read are applied, in order
        expected = self._queue.active_after(d, logic, (now, order)) - held - {GATEWAY_PROBE}
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

    def link_check_wanted(self, logic: int) -> bool:
        """Whether an hccn_tool link check of this chip is useful (§1.1 "Link status"): the driver
        reports no network code for it, or only the link down that a link check raised."""
        d = self.devices.get(logic)
        if d is None:
            return False
        return not d.network or (d.link_raised and set(d.network) == {LINK_DOWN})

    def set_link(self, logic: int, up: bool) -> bool:
        """Feed one hccn_tool link state: DOWN raises 81078603 (which then runs the 20 s rule) unless
        the driver already reports it; UP recovers only the 81078603 a link check raised. True on change."""
        d = self.devices.get(logic)
        if d is None:
            return False
        if not up and not d.link_raised and LINK_DOWN not in d.network:
            d.link_raised = True
            self.submit(DeviceEvent(logic, LINK_DOWN, OCCUR, 0, self.now(), "link"))
            return True
        if up and d.link_raised:
            d.link_raised = False
            self.submit(DeviceEvent(logic, LINK_DOWN, RECOVER, 0, self.now(), "link"))
            return True
        return False

    # -- hot reset (§6): the action's state changes ------------------------------------------------
    def resetting(self) -> set[int]:
        """Logic ids of the chips whose hot reset is running."""
        return {lg for lg, d in self.devices.items() if d.resetting}

    def reset_begin(self, logic: int) -> None:
        """A hot reset of ``logic`` starts (the chip shows as Recovering)."""
        d = self.devices.get(logic)
        if d is not None:
            d.resetting = True

    def reset_end(self, logic: int, booted: bool) -> None:
        """A hot reset of ``logic`` ended; ``booted``: the chip came back, re-poll its codes."""
        d = self.devices.get(logic)
        if d is None:
            return
        d.resetting = False
        if booted:
            d.reinit = True

    def reset_failed(self, logic: int) -> bool:
        """A hot reset failed or was refused: escalate the chip to SeparateNPU (reason HotResetFailed,
        kept until its chip faults are gone). Returns True when the escalation is new."""
        d = self.devices.get(logic)
        key = (0, HOT_RESET_FAILED)
        if d is None or key in d.reasons:
            return False
        d.reasons[key] = UpgradeReason(0, NpuLevel.SeparateNPU, HOT_RESET_FAILED, self.now())
        return True

    def clear_reset_failures(self) -> list[int]:
        """Drop the HotResetFailed escalation of every chip whose chip faults are gone; returns them."""
        cleared = []
        for logic, d in self.devices.items():
            if not d.chip and d.reasons.pop((0, HOT_RESET_FAILED), None) is not None:
                cleared.append(logic)
        return cleared

    # -- the cycle ----------------------------------------------------------------------------
    def cycle(self) -> set[int]:
        """Apply due events, run duration and frequency rules, recompute levels and health.

        Returns the logic ids whose reported view may have changed.
        """
        now = self.now()
        changed: set[int] = set()
        rules.end_restart_grace(self, now)
        batch = self._queue.take_due(now)
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
                and any(abs(t - ev.time_ms) <= self.hbm_pair_window_ms for t in d.hbm_times)
            ):
                self.stats["aic_fault_paired_with_hbm"] += 1  # a consequence of the HBM fault: discarded
                continue
            last = d.last_event_ms.get(ev.code)
            if last is not None and order < last:
                self.stats["stale_event"] += 1  # an older event arriving late (e.g. a delayed recover)
                rules.stale_recover(self, d, ev)
                continue
            d.last_event_ms[ev.code] = order
            rules.apply_event(self, d, ev)
            if self.custom.duration_rule(ev.code) is not None:
                per_dev_queue[(ev.logic, ev.code)].append((ev.time_ms, ev.assertion))
        for (logic, code), q in per_dev_queue.items():
            d = self.devices[logic]
            st = d.duration.setdefault(code, DurationState())
            for t, a in q:  # a one-off notice is an occurrence that ends at once
                st.queue.extend([(t, OCCUR), (t, RECOVER)] if a == ONCE else [(t, a)])
        for logic, d in self.devices.items():
            if rules.run_duration(self, d, now) | rules.run_frequency(self, d, now, self._clear_freq):
                changed.add(logic)
            if rules.compute_levels(self, d):
                changed.add(logic)
        for stage in self.stages:
            for logic in stage.run(self, now):
                if logic in self.devices:
                    changed.add(logic)
                    rules.compute_levels(self, self.devices[logic])
        # end of cycle: once codes leave, fired frequency counters clear (§1.2 step 8)
        for logic, d in self.devices.items():
            if d.end_cycle(MAX_EVENT_MEMORY):
                changed.add(logic)
                rules.compute_levels(self, d)
        for logic, code in self._clear_freq.items():
            d = self.devices.get(logic)
            if d is not None and code in d.frequency:
                d.frequency[code].times.clear()
        self._clear_freq.clear()
        return changed

    def base_level(self, code: int, severity: int | None) -> tuple[NpuLevel, bool]:
        """A code's table level (or fallback) without escalations, and whether the code is unknown."""
        if code in NETWORK_CODES_ALL:
            if code == GATEWAY_PROBE and not self.table.known(code):
                return NpuLevel.NotHandleFault, False  # the probe starts like a link down (§2)
            return self.table.network_code_level(code)
        return self.table.chip_code_level(code, severity)

    def set_reason(self, d: Device, r: UpgradeReason) -> None:
        """Keep escalation ``r`` for ``d`` (the rules call this); a new one fires ``on_reason_change``."""
        key = (r.code, r.kind)
        new = key not in d.reasons
        d.reasons[key] = r
        if new and self.on_reason_change is not None:
            self.on_reason_change(d, r, True)

    def drop_reason(self, d: Device, code: int, kind: str) -> None:
        """Drop the escalation (code, kind) of ``d``; fires ``on_reason_change`` when there was one."""
        r = d.reasons.pop((code, kind), None)
        if r is not None and self.on_reason_change is not None:
            self.on_reason_change(d, r, False)

    def release_manual(self, logic: int, seen_until_ms: int = 0) -> bool:
        """Operator release: drop the chip's ManuallySeparateNPU reasons (§4.2 "Operator deletion")
        raised at or before ``seen_until_ms`` (ms, this host's clock; 0: all) -- a separation raised
        after what the operator saw stays. Returns whether one was dropped."""
        d = self.devices.get(logic)
        if d is None:
            return False
        keys = [
            k
            for k, r in d.reasons.items()
            if r.level == NpuLevel.ManuallySeparateNPU and (not seen_until_ms or r.time_ms <= seen_until_ms)
        ]
        for code, kind in keys:
            self.drop_reason(d, code, kind)
            if code in d.frequency:
                d.frequency[code].times.clear()
        rules.update_manual(d)
        rules.compute_levels(self, d)
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
            n += rules.relevel(self, d, custom)
            rules.compute_levels(self, d)
        return n

    def export_state(self) -> dict:
        """Escalations that must survive a restart (see :func:`deviced.rules.export_state`)."""
        return rules.export_state(self.devices)

    def import_state(self, data: dict) -> int:
        """Restore :meth:`export_state` output (see :func:`deviced.rules.import_state`). Returns the
        number of reasons restored."""
        return rules.import_state(self, data)

    def refresh(self, logic: int) -> bool:
        """Recompute one chip's levels and health now. True when they changed."""
        d = self.devices.get(logic)
        return d is not None and rules.compute_levels(self, d)

    # -- §3 levels ----------------------------------------------------------------------------
    def code_level(self, d: Device, code: int) -> NpuLevel:
        """A code's reported level: its table level (or fallback) merged with its own escalations."""
        st = d.codes().get(code)
        base = self.base_level(code, st.severity if st else 0)[0]
        for (c, _kind), r in d.reasons.items():
            if c == code and r.level > base:
                base = r.level
        return base
