"""Frequency and duration rules count DISTINCT occurrences (issue 20; docs/compatibility.md
"Deliberate differences"): a duplicate occur of a still-active fault, a re-report after a deviced
restart with the state file (the chip still carrying the fault) and state-file reloads are
idempotent; an occur after the fault had recovered is a new occurrence."""

from __future__ import annotations

import pytest

from deviced.engine import OCCUR, ONCE, RECOVER, DeviceEvent, FaultEngine
from deviced.tables import LINK_DOWN, Customization, FaultCodeTable
from faultmesh.dcmi.api import DeviceIds
from faultmesh.levels import NpuLevel

S = 1000
H = 3600 * S
IDS = [DeviceIds(i, 10 + i, i // 4, i % 4) for i in range(4)]


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_000_000_000

    def __call__(self) -> int:
        return self.t


def make(clock) -> FaultEngine:
    e = FaultEngine(FaultCodeTable.load(), Customization.load(), clock=clock)
    e.set_devices(IDS)
    for i in range(len(IDS)):
        e.apply_poll(i, [])  # the first-cycle mend: nothing live
    e.cycle()
    return e


def occur(e, logic, code, assertion=OCCUR):
    e.submit(DeviceEvent(logic, code, assertion, 2, e.now()))


def step(e, clock, ms):
    clock.t += ms
    e.cycle()


@pytest.fixture
def clock():
    return Clock()


@pytest.mark.parametrize(
    ("code", "level", "copies"),
    [(0x80E18008, NpuLevel.RestartNPU, 2), (0x80C98000, None, 2), (0x80E18005, None, 3)],
)
def test_duplicate_callbacks_of_an_active_fault_keep_its_level(clock, code, level, copies):
    e = make(clock)
    occur(e, 0, code)
    e.cycle()
    before = e.devices[0].level
    if level is not None:
        assert before == level
    for _ in range(copies + 3):  # more duplicates than the rule's Times
        step(e, clock, 500)
        occur(e, 0, code)
    for _ in range(4):
        step(e, clock, 500)  # 1.5 s later and beyond
    d = e.devices[0]
    assert d.level == before and not d.manually_separated and not d.reasons
    assert e.stats["duplicate_occur"] == copies + 3


def test_duplicate_storm_in_one_batch_and_across_cycles(clock):
    e = make(clock)
    for _ in range(200):
        occur(e, 1, 0x80E18008)
    e.cycle()
    for _ in range(50):
        step(e, clock, 100)
        for _ in range(20):
            occur(e, 1, 0x80E18008)
    e.cycle()
    assert e.devices[1].level == NpuLevel.RestartNPU and not e.devices[1].reasons


def test_an_occur_after_a_recover_is_a_new_occurrence(clock):
    e = make(clock)
    occur(e, 0, 0x80E18008)
    e.cycle()
    occur(e, 0, 0x80E18008, RECOVER)
    step(e, clock, 1100)  # the recover applies 1 s late
    occur(e, 0, 0x80E18008)
    e.cycle()
    assert e.devices[0].manually_separated


def test_a_recover_still_delayed_when_the_fault_comes_back_counts(clock):
    """occur, recover, occur again within the 1 s recover delay: the recover is stale when it falls
    due, yet the fault did recover in between, so the second occur is a distinct occurrence."""
    e = make(clock)
    occur(e, 0, 0x80E18008)
    e.cycle()
    step(e, clock, 100)
    occur(e, 0, 0x80E18008, RECOVER)
    step(e, clock, 300)
    occur(e, 0, 0x80E18008)
    e.cycle()
    step(e, clock, 1100)
    assert 0x80E18008 in e.devices[0].chip
    assert e.devices[0].manually_separated


def test_once_notices_each_count(clock):
    e = make(clock)
    occur(e, 2, 0x80E18005, ONCE)
    step(e, clock, 1000)
    occur(e, 2, 0x80E18005, ONCE)
    step(e, clock, 1000)
    assert not e.devices[2].manually_separated
    occur(e, 2, 0x80E18005, ONCE)
    step(e, clock, 1000)
    assert e.devices[2].manually_separated


def restart(e, clock) -> FaultEngine:
    saved = e.export_state()
    fresh = FaultEngine(FaultCodeTable.load(), Customization.load(), clock=clock)
    fresh.set_devices(IDS)
    fresh.import_state(saved)
    return fresh


def test_restart_with_state_file_and_the_fault_still_on_the_chip(clock):
    e = make(clock)
    occur(e, 3, 0x80E18008)
    e.cycle()
    for _ in range(3):  # three restarts, the chip still carries the fault each time
        step(e, clock, 2 * S)
        e = restart(e, clock)
        e.import_state(e.export_state())  # a reload of the same document is idempotent
        for i in range(len(IDS)):
            e.apply_poll(i, [0x80E18008] if i == 3 else [])
        e.cycle()
        occur(e, 3, 0x80E18008)  # and the driver repeats its callback
        step(e, clock, 2 * S)
        d = e.devices[3]
        assert d.level == NpuLevel.RestartNPU and not d.manually_separated, e.export_state()
    # the fault now recovers and comes back: that is the second occurrence
    occur(e, 3, 0x80E18008, RECOVER)
    step(e, clock, 1100)
    occur(e, 3, 0x80E18008)
    e.cycle()
    assert e.devices[3].manually_separated


def test_restart_after_the_fault_went_away_while_down(clock):
    """Gone at the first poll and not reported within the restart grace: it recovered while deviced
    was down (one recover), and the next occur is the second occurrence."""
    e = make(clock)
    occur(e, 3, 0x80E18008)
    e.cycle()
    e = restart(e, clock)
    for i in range(len(IDS)):
        e.apply_poll(i, [])  # gone while deviced was down
    e.cycle()
    assert e.devices[3].level == NpuLevel.RestartNPU  # held during the grace: no recover yet
    step(e, clock, e.restart_grace_ms + S)
    assert 0x80E18008 not in e.devices[3].chip and e.devices[3].level is None
    fs = e.devices[3].frequency[0x80E18008]
    assert fs.last_recover_ms >= fs.last_fault_ms and len(fs.times) == 1
    occur(e, 3, 0x80E18008)  # a new occurrence: the second in 24 h
    e.cycle()
    assert e.devices[3].manually_separated


def test_restart_during_a_link_down_does_not_count_the_duration_timeout_twice(clock):
    """81078603: the duration rule's timeout feeds the 5-in-24 h frequency rule; after a restart the
    still-down link times out again (duration state is re-derived), which is the same occurrence."""
    e = make(clock)
    occur(e, 0, LINK_DOWN)
    step(e, clock, 21 * S)
    assert e.devices[0].network_level == NpuLevel.PreSeparateNPU
    for _ in range(6):
        e = restart(e, clock)
        for i in range(len(IDS)):
            e.apply_poll(i, [LINK_DOWN] if i == 0 else [])
        e.cycle()
        step(e, clock, 21 * S)
        assert e.devices[0].network_level == NpuLevel.PreSeparateNPU
    assert not e.devices[0].manually_separated
