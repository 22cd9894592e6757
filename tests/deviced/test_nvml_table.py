"""faultmesh's NVIDIA fault table (issue 33): XIDs and NVML conditions to levels, rules, bad rows."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from deviced.nvml_table import NvidiaTable, code_xid, condition_code, xid_code
from deviced.tables import TableError
from faultmesh.levels import NpuLevel


@pytest.fixture(scope="module")
def table() -> NvidiaTable:
    return NvidiaTable.load()


def raw() -> dict:
    return json.loads((resources.files("deviced") / "data" / "nvidiaFaultTable.json").read_text())


@pytest.mark.parametrize(
    ("xid", "level"),
    [
        (13, NpuLevel.RestartBusiness),
        (31, NpuLevel.RestartBusiness),
        (43, NpuLevel.NotHandleFault),
        (45, NpuLevel.NotHandleFault),
        (48, NpuLevel.RestartNPU),
        (63, NpuLevel.FreeRestartNPU),
        (74, NpuLevel.RestartNPU),
        (79, NpuLevel.SeparateNPU),
        (92, NpuLevel.SubHealthFault),
        (94, NpuLevel.RestartBusiness),
        (95, NpuLevel.RestartNPU),
        (119, NpuLevel.RestartNPU),
        (120, NpuLevel.RestartNPU),
    ],
)
def test_catalog_xids_have_their_level(table, xid, level):
    assert table.codes.chip_code_level(xid_code(xid)) == (level, False)
    assert table.lookup(xid_code(xid)).meaning


def test_device_xids_hold_until_reset_and_application_xids_are_once(table):
    assert table.clears_on_reset(xid_code(79)) and table.clears_on_reset(xid_code(48))
    assert not table.clears_on_reset(xid_code(13)) and not table.clears_on_reset(xid_code(31))


def test_unknown_xid_gets_the_default_level_and_is_marked_unknown(table):
    assert table.codes.chip_code_level(xid_code(4242)) == (NpuLevel.RestartBusiness, True)
    e = table.lookup(xid_code(4242))
    assert e.key == "xid 4242" and e.level == NpuLevel.RestartBusiness and e.note


def test_conditions_and_spelling(table):
    lost = table.conditions["gpu-lost"]
    assert lost == condition_code(1)
    assert table.codes.chip_code_level(lost) == (NpuLevel.SeparateNPU, False)
    assert table.codes.spelling(xid_code(79)) == "4E560000004F"
    assert code_xid(xid_code(79)) == 79 and code_xid(lost) is None


def test_frequency_and_duration_rules(table):
    r13 = table.custom.frequency_rule(xid_code(13))
    assert (r13.times, r13.window_s, r13.level) == (3, 86400, NpuLevel.PreSeparateNPU)
    assert table.custom.frequency_rule(xid_code(79)) is None
    d = table.custom.duration_rule(table.conditions["hw-slowdown"])
    assert (d.fault_timeout_s, d.level) == (300, NpuLevel.PreSeparateNPU)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda o: o["Xids"][0].update(level="Sometimes"), "Sometimes"),
        (lambda o: o["Xids"].append(copy.deepcopy(o["Xids"][0])), "listed twice"),
        (lambda o: o["Xids"][0].update(clear="never"), "clear"),
        (lambda o: o["Xids"][0].update(xid=-1), "xid must be"),
        (lambda o: o["FaultDuration"][0].update(Conditions=["no-such"]), "unknown condition"),
        (lambda o: o["FaultFrequency"][0].update(Times=0), "rejected"),
        (lambda o: o.pop("DefaultXid"), "DefaultXid"),
    ],
)
def test_bad_rows_are_refused_with_the_reason(mutate, why):
    obj = raw()
    mutate(obj)
    with pytest.raises(TableError, match=why):
        NvidiaTable.from_obj(obj)
