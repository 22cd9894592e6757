"""A deviced restart is invisible to the rules (issue 30): a fault active before the stop and seen
again after the start -- by the first poll, by the first callback, or only through the state file --
is the same occurrence: no frequency count, the same first-seen time, no recover in between. One that
nobody reports within the restart grace recovered while deviced was down, and counts one recover."""

from __future__ import annotations

import json
import logging

from deviced.engine import OCCUR, RECOVER, DeviceEvent, FaultEngine
from deviced.tables import LINK_DOWN, Customization, FaultCodeTable
from faultmesh.dcmi.api import DeviceIds
from faultmesh.levels import NpuLevel

S = 1000
HBM = 0x80E18008  # RestartNPU; 2 occurrences in 24 h -> ManuallySeparateNPU (default customization)
IDS = [DeviceIds(i, 10 + i, 0, i) for i in range(8)]


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_000_000_000

    def __call__(self) -> int:
        return self.t


def started(clock, saved: dict | None = None) -> FaultEngine:
    """A fresh engine on the chips, the state file (a JSON round trip) imported, as deviced starts."""
    e = FaultEngine(FaultCodeTable.load(), Customization.load(), clock=clock)
    e.set_devices(IDS)
    if saved is not None:
        e.import_state(json.loads(json.dumps(saved)))
    return e


def first_poll(e: FaultEngine, live: dict[int, list[int]]) -> None:
    for logic in e.devices:
        e.apply_poll(logic, live.get(logic, []))
    e.cycle()


def advance(e: FaultEngine, clock: Clock, ms: int) -> None:
    clock.t += ms
    e.cycle()


def with_fault_on_npu5(clock) -> tuple[FaultEngine, int]:
    e = started(clock)
    first_poll(e, {})
    e.submit(DeviceEvent(5, HBM, OCCUR, 2, e.now()))
    e.cycle()
    assert e.devices[5].level == NpuLevel.RestartNPU
    return e, e.devices[5].chip[HBM].first_seen_ms


def test_first_poll_still_shows_the_fault():
    clock = Clock()
    e, t1 = with_fault_on_npu5(clock)
    for _ in range(3):
        advance(e, clock, 30 * S)
        e = started(clock, e.export_state())
        first_poll(e, {5: [HBM]})
        e.submit(DeviceEvent(5, HBM, OCCUR, 2, e.now()))  # and the driver repeats its callback
        advance(e, clock, 2 * S)
        d = e.devices[5]
        assert d.level == NpuLevel.RestartNPU and not d.reasons
        assert d.chip[HBM].first_seen_ms == t1
        assert d.frequency[HBM].times == [t1]


def test_first_poll_misses_it_and_the_first_callback_brings_it_back():
    """The issue-30 reproduction: the driver's list is empty at the first poll after the restart (a
    simulator that forgot its faults, a driver still re-initialising), the callback comes a moment
    later: still one occurrence, RestartNPU kept, never reported as recovered."""
    clock = Clock()
    e, t1 = with_fault_on_npu5(clock)
    e = started(clock, e.export_state())
    first_poll(e, {})
    assert e.devices[5].level == NpuLevel.RestartNPU  # held, not recovered
    advance(e, clock, 3 * S)
    e.submit(DeviceEvent(5, HBM, OCCUR, 2, e.now()))
    advance(e, clock, 2 * S)
    advance(e, clock, e.restart_grace_ms + 2 * S)  # past the grace: nothing expires, it was seen
    d = e.devices[5]
    assert d.level == NpuLevel.RestartNPU and not d.manually_separated
    assert d.chip[HBM].first_seen_ms == t1 and d.frequency[HBM].times == [t1]
    assert d.frequency[HBM].last_recover_ms == 0
    assert e.stats["rereport_after_restart"] == 1 and e.stats["events_restart"] == 0


def test_a_recover_while_down_counts_once_and_a_later_occur_is_the_second(caplog):
    caplog.set_level(logging.INFO, logger="deviced.engine")
    clock = Clock()
    e, t1 = with_fault_on_npu5(clock)
    advance(e, clock, 60 * S)
    e = started(clock, e.export_state())
    first_poll(e, {})
    advance(e, clock, e.restart_grace_ms + S)
    d = e.devices[5]
    assert HBM not in d.chip and d.health == "Healthy"
    assert e.stats["events_restart"] == 1  # one recover
    assert caplog.text.count("fault recovered while deviced was down") == 1
    assert d.frequency[HBM].last_recover_ms > d.frequency[HBM].last_fault_ms == t1
    # a second restart now finds nothing active: no recover again
    e = started(clock, e.export_state())
    first_poll(e, {})
    advance(e, clock, e.restart_grace_ms + S)
    assert e.stats["events_restart"] == 0
    e.submit(DeviceEvent(5, HBM, OCCUR, 2, e.now()))
    advance(e, clock, S)
    assert e.devices[5].manually_separated  # the second occurrence in 24 h


def test_a_fault_recovered_after_the_restart_recovers_normally():
    clock = Clock()
    e, _ = with_fault_on_npu5(clock)
    e = started(clock, e.export_state())
    first_poll(e, {5: [HBM]})
    advance(e, clock, S)
    e.submit(DeviceEvent(5, HBM, RECOVER, 2, e.now()))
    advance(e, clock, 2 * S)
    assert HBM not in e.devices[5].chip and e.devices[5].level is None


def test_a_state_file_of_the_previous_release_restores_the_active_frequency_code():
    """Version 1 (before issue 30) had no active codes: a frequency code not recovered is active."""
    clock = Clock()
    v1 = {
        "version": 1,
        "devices": {"15": {"reasons": [], "frequency": {str(HBM): {
            "times": [clock.t - 5 * S], "last_fault_ms": clock.t - 5 * S, "last_recover_ms": 0}}}},
    }  # fmt: skip
    e = started(clock, v1)
    first_poll(e, {5: [HBM]})
    e.submit(DeviceEvent(5, HBM, OCCUR, 2, e.now()))
    advance(e, clock, 2 * S)
    d = e.devices[5]
    assert d.level == NpuLevel.RestartNPU and not d.manually_separated
    assert d.chip[HBM].first_seen_ms == clock.t - 7 * S


def test_a_link_down_across_restarts_times_out_once():
    """81078603's duration rule (PreSeparateNPU after 20 s) restarts from the first-seen time: the
    timeout is re-derived at the same moment, so the frequency rule (5 in 24 h) sees it once."""
    clock = Clock()
    e = started(clock)
    first_poll(e, {})
    e.submit(DeviceEvent(0, LINK_DOWN, OCCUR, 2, e.now()))
    advance(e, clock, 21 * S)
    assert e.devices[0].network_level == NpuLevel.PreSeparateNPU
    for _ in range(6):
        e = started(clock, e.export_state())
        first_poll(e, {0: [LINK_DOWN]})
        assert e.devices[0].network_level == NpuLevel.PreSeparateNPU  # at once, not 20 s later
        advance(e, clock, 21 * S)
    d = e.devices[0]
    assert not d.manually_separated and len(d.frequency[LINK_DOWN].times) == 1
