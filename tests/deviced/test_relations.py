"""Relation faults and their faultDuration.json deadlines in deviced's engine (reference clusterd.md
§6.3): a trigger on the node escalates the chips carrying the relation fault; a fault that times
out without a trigger is settled by the reference's defaults; a reload starts over."""

from __future__ import annotations

import pytest

from deviced.engine import OCCUR, RECOVER, DeviceEvent, FaultEngine
from deviced.faults import chip_faults
from deviced.relations import RELATION, RelationRules
from deviced.switch import SwitchState
from deviced.tables import (
    LINK_DOWN,
    Customization,
    FaultCodeTable,
    SwitchFaultTable,
    load_fault_duration,
    load_relations,
)
from faultmesh.dcmi.api import DeviceIds
from faultmesh.dcmi.lingqu import SwitchEvent
from faultmesh.faultrules import DurationTable, RelationTable
from faultmesh.levels import NpuLevel

S = 1000
HCCL = 0x8C1F860B  # trigger -> Separate
HCCL_SUB = 0x8C1F8609  # trigger -> SubHealth
CQE = 0x8C1F8608


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_000_000_000

    def __call__(self) -> int:
        return self.t


@pytest.fixture
def clock():
    return Clock()


def make(clock, relations=None, durations=None, a3=False, switch=None):
    eng = FaultEngine(FaultCodeTable.load(), Customization.from_obj({}), clock=clock)
    eng.set_devices([DeviceIds(i, 10 + i, 0, i) for i in range(4)])
    for i in range(4):
        eng.apply_poll(i, [])
    rel = RelationRules(
        relations or load_relations(), durations or load_fault_duration(), switch, a3=lambda: a3
    )
    eng.add_stage(rel)
    eng.cycle()
    return eng, rel


def occur(eng, logic, code, assertion=OCCUR):
    eng.submit(DeviceEvent(logic, code, assertion, 2, eng.now()))


def step(eng, clock, ms=S):
    clock.t += ms
    eng.cycle()


def test_trigger_separates_the_chip_with_the_relation_fault(clock):
    eng, rel = make(clock)
    occur(eng, 1, LINK_DOWN)
    step(eng, clock)
    d1 = eng.devices[1]
    assert eng.code_level(d1, LINK_DOWN) == NpuLevel.NotHandleFault  # no trigger yet
    occur(eng, 3, HCCL)  # the trigger on another chip of the node
    step(eng, clock)
    assert eng.code_level(d1, LINK_DOWN) == NpuLevel.SeparateNPU
    assert d1.network_health == "UnHealthy"
    f = next(f for f in chip_faults(eng, "n") if f.device_id == 11 and f.code == "81078603")
    assert f.level == "SeparateNPU" and RELATION in f.attributes["upgrade"]
    assert rel.stats["matched"] == 1
    # the relation fault leaves: its escalation goes with it
    occur(eng, 1, LINK_DOWN, RECOVER)
    step(eng, clock, 2 * S)
    assert (LINK_DOWN, RELATION) not in d1.reasons and not rel.watched


def test_subhealth_then_separate_dominates(clock):
    eng, _ = make(clock)
    occur(eng, 0, LINK_DOWN)
    occur(eng, 2, HCCL_SUB)
    step(eng, clock)
    d0 = eng.devices[0]
    assert d0.reasons[(LINK_DOWN, RELATION)].level == NpuLevel.SubHealthFault
    occur(eng, 2, HCCL)
    step(eng, clock)
    assert d0.reasons[(LINK_DOWN, RELATION)].level == NpuLevel.SeparateNPU


def test_deadline_passes_without_trigger(clock):
    durations = DurationTable.from_obj([{"FaultCode": "81078603", "TimeOutInterval": 10}])
    eng, rel = make(clock, durations=durations)
    occur(eng, 1, LINK_DOWN)
    step(eng, clock)
    assert rel.next_due_ms() == rel.watched[(1, "81078603")].since_ms + 10 * S
    step(eng, clock, 11 * S)
    assert rel.watched[(1, "81078603")].timed_out and rel.stats["timed_out"] == 1
    occur(eng, 2, HCCL)  # too late: the fault no longer waits for a trigger
    step(eng, clock)
    assert (LINK_DOWN, RELATION) not in eng.devices[1].reasons
    assert rel.next_due_ms() is None


def test_zero_deadline_matches_only_in_the_first_cycle(clock):
    durations = DurationTable.from_obj([])  # no entry: 0 s
    eng, rel = make(clock, durations=durations)
    occur(eng, 1, LINK_DOWN)
    occur(eng, 2, HCCL)
    step(eng, clock)
    assert eng.devices[1].reasons[(LINK_DOWN, RELATION)].level == NpuLevel.SeparateNPU


def test_a3_cqe_trigger_separates_on_timeout(clock):
    durations = DurationTable.from_obj([{"FaultCode": "81078603", "TimeOutInterval": 10}])
    eng, rel = make(clock, durations=durations, a3=True)
    occur(eng, 1, LINK_DOWN)
    step(eng, clock)
    occur(eng, 2, CQE)  # on A3 a CQE trigger only settles the timed-out fault
    step(eng, clock)
    assert (LINK_DOWN, RELATION) not in eng.devices[1].reasons
    step(eng, clock, 10 * S)
    assert eng.devices[1].reasons[(LINK_DOWN, RELATION)].level == NpuLevel.SeparateNPU
    assert rel.stats["settled"] == 1


def test_unhealthy_chip_contributes_no_relation_fault(clock):
    eng, rel = make(clock)
    occur(eng, 1, 0x80E18008)  # RestartNPU: the chip is UnHealthy
    step(eng, clock)
    occur(eng, 1, LINK_DOWN)
    occur(eng, 2, HCCL)
    step(eng, clock)
    assert not rel.watched and (LINK_DOWN, RELATION) not in eng.devices[1].reasons


L2_DOWN = SwitchEvent(0x08520003, 0xFFFFFFFF, 2, 1, 0, 5, 2, 1, 1, 1, 0)


def test_switch_relation_fault_trigger_and_timeout(clock):
    sw = SwitchState(SwitchFaultTable.load())
    durations = DurationTable.from_obj([{"FaultCode": "[0x08520003,na,L2,na]", "TimeOutInterval": 5}])
    eng, rel = make(clock, durations=durations, switch=sw)
    base = sw.faults("n")
    assert base == []
    sw.apply(L2_DOWN, clock.t)
    step(eng, clock)
    (f,) = sw.faults("n")
    assert f.code == "[0x08520003,na,L2,na]" and "upgrade" not in f.attributes
    step(eng, clock, 6 * S)  # no trigger: the reference's default for a switch fault is SubHealth
    (f,) = sw.faults("n")
    assert f.level == "SubHealthFault" and f.attributes["upgrade"] == "RelationFault"
    sw.apply(L2_DOWN._replace(assertion=0), clock.t)
    step(eng, clock)
    assert sw.faults("n") == [] and sw.overrides == {}


def test_switch_relation_fault_with_trigger_is_separate(clock):
    sw = SwitchState(SwitchFaultTable.load())
    eng, _ = make(clock, switch=sw)
    sw.apply(L2_DOWN, clock.t)
    occur(eng, 0, HCCL)
    step(eng, clock)
    (f,) = sw.faults("n")
    assert f.level == "Separate"


def test_reload_starts_over(clock):
    eng, rel = make(clock)
    occur(eng, 1, LINK_DOWN)
    occur(eng, 2, HCCL)
    step(eng, clock)
    assert (LINK_DOWN, RELATION) in eng.devices[1].reasons
    rel.set_tables(RelationTable.from_obj([]))  # an operator drops every rule
    step(eng, clock)
    assert (LINK_DOWN, RELATION) not in eng.devices[1].reasons and not rel.watched
