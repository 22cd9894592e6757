"""FaultEngine with an injected clock: levels, recover delay, card drop, mend rules, the 20 s / 60 s
link-down duration rule, the 5-in-24 h frequency rule and its 48 h release, the gateway probe
(reference deviced.md §1.1, §2, §3, §4.2, §4.3)."""

from __future__ import annotations

import pytest

from deviced.engine import OCCUR, ONCE, RECOVER, DeviceEvent, FaultEngine
from deviced.tables import CARD_DROP, GATEWAY_PROBE, LINK_DOWN, Customization, FaultCodeTable
from faultmesh.dcmi.api import DeviceIds
from faultmesh.levels import NpuLevel

S = 1000
H = 3600 * S


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_000_000_000

    def __call__(self) -> int:
        return self.t

    def advance(self, ms: int) -> None:
        self.t += ms


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def eng(clock):
    e = FaultEngine(FaultCodeTable.load(), Customization.load(), clock=clock)
    e.set_devices([DeviceIds(i, 10 + i, i // 4, i % 4) for i in range(8)])
    for i in range(8):
        e.apply_poll(i, [])  # first-cycle mend: nothing live
    e.cycle()
    return e


def ev(eng, logic, code, assertion, severity=2):
    return eng.submit(DeviceEvent(logic, code, assertion, severity, eng.now()))


def step(eng, clock, ms):
    clock.advance(ms)
    eng.cycle()


def test_levels_precedence_and_health(eng, clock):
    d = eng.devices[2]
    ev(eng, 2, 0x81AF8009, OCCUR)  # NotHandleFault
    eng.cycle()
    assert (d.level, d.health) == (NpuLevel.NotHandleFault, "Healthy")
    ev(eng, 2, 0x80C98009, OCCUR)  # RestartRequest
    ev(eng, 2, 0x80E18008, OCCUR)  # RestartNPU
    eng.cycle()
    assert (d.level, d.health) == (NpuLevel.RestartNPU, "UnHealthy")
    ev(eng, 2, 0xA2301001, OCCUR)  # SeparateNPU beats RestartNPU
    eng.cycle()
    assert d.level == NpuLevel.SeparateNPU
    assert eng.code_level(d, 0x80C98009) == NpuLevel.RestartRequest


def test_subhealth_and_preseparate_health(eng, clock):
    ev(eng, 1, 0x110000002, OCCUR)
    eng.cycle()
    d = eng.devices[1]
    assert d.network_level == NpuLevel.SubHealthFault and d.network_health == "UnHealthy"
    assert d.health == "Healthy"
    ev(eng, 3, 0x110001024, OCCUR)  # PreSeparateNPU network code
    eng.cycle()
    assert eng.devices[3].network_health == "UnHealthy"


def test_preseparate_chip_healthy_while_in_use(clock):
    e = FaultEngine(
        FaultCodeTable.from_obj({"PreSeparateNPUCodes": ["8118043C"]}), Customization.load(), clock=clock
    )
    e.set_devices([DeviceIds(0, 0, 0, 0)])
    e.submit(DeviceEvent(0, 0x8118043C, OCCUR, 1, clock()))
    e.cycle()
    assert e.devices[0].health == "UnHealthy"
    e.set_in_use([0])
    e.cycle()
    assert e.devices[0].health == "Healthy"


def test_unknown_code_uses_severity_and_is_counted(eng):
    ev(eng, 0, 0xDEAD0001, OCCUR, severity=3)
    ev(eng, 1, 0xDEAD0002, OCCUR, severity=0)
    eng.cycle()
    assert eng.devices[0].level == NpuLevel.SeparateNPU
    assert eng.devices[1].level == NpuLevel.NotHandleFault
    assert eng.stats["unknown_code"] == 2


def test_recover_is_applied_one_second_late(eng, clock):
    ev(eng, 4, 0x80E18008, OCCUR)
    eng.cycle()
    ev(eng, 4, 0x80E18008, RECOVER)
    step(eng, clock, 500)
    assert 0x80E18008 in eng.devices[4].chip
    step(eng, clock, 600)
    assert 0x80E18008 not in eng.devices[4].chip
    assert eng.devices[4].health == "Healthy"


def test_bad_input_is_counted_and_state_stays_right(eng, clock):
    assert not ev(eng, 99, 0x80E18008, OCCUR)  # out-of-range device
    assert not ev(eng, 1, 0, OCCUR)  # event id 0
    assert not eng.submit(DeviceEvent(1, 0x80E18008, 7, 0, clock()))
    ev(eng, 1, 0x80E18008, RECOVER)  # recover with no occur
    step(eng, clock, 1100)
    ev(eng, 1, 0x80E18008, OCCUR)
    ev(eng, 1, 0x80E18008, OCCUR)  # duplicate
    eng.cycle()
    first = eng.devices[1].chip[0x80E18008].first_seen_ms
    step(eng, clock, 5 * S)
    ev(eng, 1, 0x80E18008, OCCUR)
    eng.cycle()
    assert eng.devices[1].chip[0x80E18008].first_seen_ms == first
    assert eng.stats["rejected_unknown_device"] == 1
    assert eng.stats["ignored_event_id_0"] == 1
    assert eng.stats["rejected_bad_assertion"] == 1
    assert eng.stats["recover_without_occur"] == 1
    assert eng.stats["duplicate_occur"] == 2


def test_reordered_occur_recover_apply_by_time(eng, clock):
    t = clock()
    eng.submit(DeviceEvent(5, 0x80E18008, RECOVER, 0, t + 10, "poll"))
    eng.submit(DeviceEvent(5, 0x80E18008, OCCUR, 0, t, "poll"))
    clock.advance(20)
    eng.cycle()
    assert 0x80E18008 not in eng.devices[5].chip


def test_once_event_lives_one_cycle(eng, clock):
    ev(eng, 6, 0x80E18008, ONCE)
    changed = eng.cycle()
    assert 6 in changed
    assert 0x80E18008 not in eng.devices[6].chip  # dropped at the end of that cycle


def test_card_drop_occur_and_recover(eng, clock):
    assert eng.set_card_drop(3, True)
    assert not eng.set_card_drop(3, True)  # once
    eng.cycle()
    d = eng.devices[3]
    assert CARD_DROP in d.chip and d.level == NpuLevel.RestartNPU and d.health == "UnHealthy"
    eng.set_card_drop(3, False)
    eng.cycle()
    assert CARD_DROP not in d.chip and d.health == "Healthy"


def test_mend_rules(eng, clock):
    assert eng.mend_reason(0) is None
    eng.mark_reinit(0)
    assert eng.mend_reason(0) == "re-init"
    eng.apply_poll(0, [0x80E18008])
    assert eng.mend_reason(0) is None
    eng.cycle()
    assert eng.devices[0].chip[0x80E18008].severity == 0  # polling: severity 0
    step(eng, clock, 5 * 60 * S + 1)
    assert eng.mend_reason(0) == "unhealthy for more than 5 min"
    ev(eng, 2, 0x8C2FA009, OCCUR)  # reset finished only re-polls
    assert eng.mend_reason(2) == "re-init"
    eng.subscribe_failed = True
    assert eng.mend_reason(1) == "subscription failed"
    eng.apply_poll(0, [])
    eng.cycle()
    assert eng.devices[0].chip == {}


def test_link_down_20s_rule(eng, clock):
    d = eng.devices[5]
    ev(eng, 5, LINK_DOWN, OCCUR)
    eng.cycle()
    assert d.network_level == NpuLevel.NotHandleFault and d.network_health == "Healthy"
    step(eng, clock, 20 * S)
    assert d.network_health == "Healthy"  # exactly 20 s: not yet
    step(eng, clock, 1 * S)
    assert d.network_level == NpuLevel.PreSeparateNPU and d.network_health == "UnHealthy"
    assert d.health == "Healthy"  # a network fault does not touch chip Health
    reason = d.reasons[(LINK_DOWN, "FaultDuration")]
    assert reason.time_ms == d.network[LINK_DOWN].first_seen_ms + 20 * S
    ev(eng, 5, LINK_DOWN, RECOVER)
    step(eng, clock, 2 * S)
    assert LINK_DOWN not in d.network
    assert d.network_health == "UnHealthy"  # stays escalated until 60 s recovered
    step(eng, clock, 30 * S)
    ev(eng, 5, LINK_DOWN, OCCUR)  # re-occurs within 60 s: stays escalated
    step(eng, clock, 1 * S)
    ev(eng, 5, LINK_DOWN, RECOVER)
    step(eng, clock, 59 * S)
    assert d.network_health == "UnHealthy"
    step(eng, clock, 3 * S)
    assert d.network_health == "Healthy" and d.network_level is None


def test_short_link_flap_does_not_escalate(eng, clock):
    ev(eng, 2, LINK_DOWN, OCCUR)
    step(eng, clock, 10 * S)
    ev(eng, 2, LINK_DOWN, RECOVER)
    step(eng, clock, 60 * S)
    assert eng.devices[2].network_health == "Healthy" and not eng.devices[2].reasons


def flap_escalate(eng, clock, logic):
    ev(eng, logic, LINK_DOWN, OCCUR)
    step(eng, clock, 21 * S)
    ev(eng, logic, LINK_DOWN, RECOVER)
    step(eng, clock, 62 * S)


def test_five_escalations_in_24h_manually_separate_then_48h_release(eng, clock):
    d = eng.devices[7]
    for i in range(4):
        flap_escalate(eng, clock, 7)
        assert not d.manually_separated, i
        step(eng, clock, H)
    flap_escalate(eng, clock, 7)
    assert d.manually_separated
    assert d.network_level == NpuLevel.ManuallySeparateNPU and d.network_health == "UnHealthy"
    step(eng, clock, 47 * H)
    assert d.manually_separated
    step(eng, clock, 1 * H + 1 * S)
    assert not d.manually_separated and d.network_health == "Healthy"


def test_frequency_counts_occurrences_outside_window_drop(clock):
    custom = Customization.from_obj(
        {
            "FaultFrequency": [
                {
                    "EventId": ["80E18005"],
                    "TimeWindow": 3600,
                    "Times": 3,
                    "FaultHandling": "SeparateNPU",
                    "ReleaseTimeWindow": 600,
                }
            ]
        }
    )
    e = FaultEngine(FaultCodeTable.load(), custom, clock=clock)
    e.set_devices([DeviceIds(0, 0, 0, 0)])
    for _ in range(2):
        e.submit(DeviceEvent(0, 0x80E18005, OCCUR, 2, clock()))
        e.cycle()
        e.submit(DeviceEvent(0, 0x80E18005, RECOVER, 2, clock()))
        step(e, clock, 2 * S)
    step(e, clock, 3600 * S)  # the two occurrences leave the window
    e.submit(DeviceEvent(0, 0x80E18005, OCCUR, 2, clock()))
    e.cycle()
    assert e.devices[0].level == NpuLevel.RestartNPU
    for _ in range(2):
        e.submit(DeviceEvent(0, 0x80E18005, RECOVER, 2, clock()))
        step(e, clock, 2 * S)
        e.submit(DeviceEvent(0, 0x80E18005, OCCUR, 2, clock()))
        e.cycle()
    assert e.devices[0].level == NpuLevel.SeparateNPU
    e.submit(DeviceEvent(0, 0x80E18005, RECOVER, 2, clock()))
    step(e, clock, 2 * S)
    assert e.devices[0].level == NpuLevel.SeparateNPU  # kept through the upgrade reason
    step(e, clock, 601 * S)
    assert e.devices[0].level is None  # released 600 s after recovery


def test_gateway_probe_feeds_the_20s_rule(eng, clock):
    d = eng.devices[1]
    assert eng.set_probe(1, False)
    eng.cycle()
    assert GATEWAY_PROBE in d.network and d.network_health == "Healthy"
    for _ in range(9):
        step(eng, clock, 2500)
        eng.set_probe(1, False)  # repeated abnormal probes: no new events
    assert d.network_health == "UnHealthy" and d.network_level == NpuLevel.PreSeparateNPU
    eng.set_probe(1, True)
    step(eng, clock, 61 * S)
    eng.cycle()
    assert d.network_health == "Healthy"


def test_escalations_survive_a_restart(eng, clock):
    for _ in range(5):
        flap_escalate(eng, clock, 4)
    assert eng.devices[4].manually_separated
    saved = eng.export_state()
    assert list(saved["devices"]) == ["14"]  # keyed by physical id
    fresh = FaultEngine(FaultCodeTable.load(), Customization.load(), clock=clock)
    fresh.set_devices([DeviceIds(i, 10 + i, i // 4, i % 4) for i in range(8)])
    assert fresh.import_state(saved) == 1
    d = fresh.devices[4]
    assert d.manually_separated and d.network_level == NpuLevel.ManuallySeparateNPU
    fresh.cycle()
    assert d.network_health == "UnHealthy"
    step(fresh, clock, 48 * H + 2 * S)
    assert not d.manually_separated and d.network_health == "Healthy"
    assert fresh.import_state({"devices": {"99": {}, "x": 1, "12": {"reasons": [{"code": "zz"}]}}}) == 0
    assert fresh.stats["restore_skipped"] == 3


def test_poll_while_a_stale_recover_is_queued(eng, clock):
    """A delayed callback recover older than a later poll is stale; a poll in between must not count it."""
    x = 0x80C98009
    ev(eng, 0, x, OCCUR)
    eng.cycle()
    clock.advance(100)
    ev(eng, 0, x, RECOVER)  # due 1 s later
    clock.advance(100)
    eng.apply_poll(0, [x], eng.begin_poll(0))  # the chip raised x again (its callback was dropped)
    eng.cycle()
    clock.advance(100)
    eng.apply_poll(0, [], eng.begin_poll(0))  # ... and cleared it again
    eng.cycle()
    assert x not in eng.devices[0].chip
    clock.advance(1000)
    eng.cycle()
    assert x not in eng.devices[0].chip
    assert eng.stats["stale_event"] == 1


def test_overflow_during_a_read_keeps_the_chip_in_the_reinit_set(eng):
    at = eng.begin_poll(3)
    eng.mark_reinit(3)  # a callback overflow drained while the read was in flight
    eng.apply_poll(3, [], at)
    assert eng.mend_reason(3) == "re-init"


def test_flood_of_distinct_codes_is_bounded(eng, clock):
    from deviced.engine import MAX_CODES_PER_DEVICE

    for i in range(MAX_CODES_PER_DEVICE + 100):
        ev(eng, 0, 0xDE000000 + i, OCCUR, severity=0)
    eng.cycle()
    assert len(eng.devices[0].chip) == MAX_CODES_PER_DEVICE
    assert eng.stats["rejected_too_many_codes"] == 100
    for i in range(MAX_CODES_PER_DEVICE + 100):
        ev(eng, 0, 0xDE000000 + i, RECOVER, severity=0)
    step(eng, clock, 1100)
    assert eng.devices[0].chip == {} and eng.devices[0].health == "Healthy"
    for i in range(3000):  # distinct once-events: nothing stays, memory stays bounded
        ev(eng, 1, 0xAB000000 + i, ONCE, severity=0)
    eng.cycle()
    assert eng.devices[1].chip == {} and len(eng.devices[1].last_event_ms) <= 2048


def test_once_link_notice_does_not_escalate(eng, clock):
    ev(eng, 3, LINK_DOWN, ONCE)
    eng.cycle()
    step(eng, clock, 30 * S)
    assert eng.devices[3].network_health == "Healthy" and not eng.devices[3].reasons


def test_aic_bus_fault_paired_with_hbm_fault_is_discarded(clock):
    custom = Customization.from_obj(
        {"FaultDuration": [{"EventId": ["80E01801"], "FaultTimeout": 30, "RecoverTimeout": 60,
                            "FaultHandling": "SeparateNPU"}]}
    )  # fmt: skip
    e = FaultEngine(FaultCodeTable.load(), custom, clock=clock)
    e.set_devices([DeviceIds(0, 0, 0, 0), DeviceIds(1, 1, 0, 1)])
    t = clock()
    e.submit(DeviceEvent(0, 0x80C98009, OCCUR, 2, t))  # AIC bus fault, held 5 s
    e.submit(DeviceEvent(0, 0x80E01801, OCCUR, 2, t + 3 * S))  # HBM fault 3 s later: they pair
    e.submit(DeviceEvent(1, 0x80CB8009, OCCUR, 2, t))  # no HBM fault on chip 1: released after 5 s
    clock.advance(3 * S)
    e.cycle()
    assert 0x80C98009 not in e.devices[0].chip and 0x80CB8009 not in e.devices[1].chip
    assert 0x80E01801 in e.devices[0].chip
    clock.advance(2 * S + 1)
    e.cycle()
    assert 0x80C98009 not in e.devices[0].chip
    assert 0x80CB8009 in e.devices[1].chip
    assert e.stats["aic_fault_paired_with_hbm"] == 1


def test_aic_bus_fault_not_held_without_hbm_duration_rule(eng):
    ev(eng, 0, 0x80C98009, OCCUR)
    eng.cycle()
    assert 0x80C98009 in eng.devices[0].chip


def test_a_rule_raised_level_says_which_rule_and_which_occurrences(clock):
    """Why a chip was separated (issue 31): the fault record names the rule in words and the
    occurrence times it counted, not only ``upgrade=FaultFrequency``."""
    from deviced.faults import chip_faults

    custom = Customization.from_obj(
        {"FaultFrequency": [{"EventId": ["80E18005"], "TimeWindow": 3600, "Times": 3,
                             "FaultHandling": "SeparateNPU", "ReleaseTimeWindow": 600}]}
    )  # fmt: skip
    e = FaultEngine(FaultCodeTable.load(), custom, clock=clock)
    e.set_devices([DeviceIds(0, 0, 0, 0)])
    seen = []
    for i in range(3):
        seen.append(clock())
        e.submit(DeviceEvent(0, 0x80E18005, OCCUR, 2, clock()))
        e.cycle()
        if i < 2:
            e.submit(DeviceEvent(0, 0x80E18005, RECOVER, 2, clock()))
            step(e, clock, 2 * S)
    [f] = [f for f in chip_faults(e, "node-1") if f.code == "80E18005"]
    assert f.level == "SeparateNPU"
    assert f.attributes["upgrade"] == "FaultFrequency"
    assert f.attributes["upgrade_rule"] == "FaultFrequency: 3 times in 3600 s -> SeparateNPU"
    assert f.attributes["upgrade_occurrences_ms"] == ",".join(str(t) for t in seen)
