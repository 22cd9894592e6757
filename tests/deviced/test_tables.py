"""deviced fault tables: the default tables agree with the reference tables; levels, precedence,
unknown-code fallback, network buckets, rule validation (reference deviced.md §2, §3, §4, §7)."""

from __future__ import annotations

import json

import pytest

from deviced import tables
from deviced.tables import Customization, FaultCodeTable, SwitchFaultTable
from faultmesh.levels import NpuLevel


def test_default_fault_code_table_agrees_with_reference(fault_tables):
    ours = FaultCodeTable.load()
    ref = FaultCodeTable.load(fault_tables / "faultCode.json")
    assert len(ref) == 802  # the reference file's unique codes (§3.2)
    assert (
        ours._level == ref._level
    )  # every code at the same level (tests/test_shipped_tables.py: all tables)


def test_reference_table_levels_and_precedence(fault_tables):
    ref = FaultCodeTable.load(fault_tables / "faultCode.json")
    assert ref.listed_level(0x40F84E00) == NpuLevel.RestartNPU  # card drop
    assert ref.listed_level(0x81078603) == NpuLevel.NotHandleFault
    # A2301001 is in RestartBusiness and SeparateNPU: Separate wins (§3.2)
    assert ref.listed_level(0xA2301001) == NpuLevel.SeparateNPU
    assert ref.spelling(0x020001002) == "020001002"  # leading zero kept for display
    assert ref.chip_code_level(0x020001002)[0] == NpuLevel.SeparateNPU


def test_bucket_precedence_on_own_table():
    t = FaultCodeTable.from_obj(
        {
            "NotHandleFaultCodes": ["1"],
            "SubHealthFaultCodes": ["2", "1"],
            "RestartRequestCodes": ["3"],
            "RestartBusinessCodes": ["4", "3"],
            "FreeRestartNPUCodes": ["5"],
            "RestartNPUCodes": ["6", "5"],
            "PreSeparateNPUCodes": ["7", "6"],
            "SeparateNPUCodes": ["8", "7", "zz"],
        }
    )
    assert [t.listed_level(c) for c in range(1, 9)] == [
        NpuLevel.SubHealthFault,
        NpuLevel.SubHealthFault,
        NpuLevel.RestartBusiness,
        NpuLevel.RestartBusiness,
        NpuLevel.RestartNPU,
        NpuLevel.PreSeparateNPU,
        NpuLevel.SeparateNPU,
        NpuLevel.SeparateNPU,
    ]


@pytest.mark.parametrize(
    ("severity", "level"),
    [
        (0, NpuLevel.NotHandleFault),
        (1, NpuLevel.NotHandleFault),
        (2, NpuLevel.SeparateNPU),
        (3, NpuLevel.SeparateNPU),
        (None, NpuLevel.SeparateNPU),
        (9, NpuLevel.SeparateNPU),
    ],
)
def test_unknown_code_severity_fallback(severity, level):
    t = FaultCodeTable.load()
    assert t.chip_code_level(0xDEAD0001, severity) == (level, True)


def test_network_codes_restricted_to_four_buckets():
    t = FaultCodeTable.from_obj(
        {
            "RestartNPUCodes": ["81078603"],
            "SubHealthFaultCodes": ["81078607"],
            "PreSeparateNPUNetworkCodes": ["110000002"],
        }
    )
    assert t.network_code_level(0x81078603) == (NpuLevel.NotHandleFault, False)  # forced
    assert t.network_code_level(0x81078607) == (NpuLevel.SubHealthFault, False)
    assert t.network_code_level(0x110000002) == (NpuLevel.PreSeparateNPU, False)  # explicit key
    assert t.network_code_level(0x110001024) == (NpuLevel.PreSeparateNPU, True)  # unlisted


def test_default_customization_agrees_with_reference(fault_tables):
    ours = Customization.load()
    ref = Customization.load(fault_tables / "faultCustomization.json")
    assert not ours.rejected and not ref.rejected
    assert len(ref.frequency) == 43 and set(ref.duration) == {0x81078603}
    assert ours.frequency == ref.frequency and ours.duration == ref.duration
    ld = ours.duration[tables.LINK_DOWN]
    assert (ld.fault_timeout_s, ld.recover_timeout_s, ld.level) == (20, 60, NpuLevel.PreSeparateNPU)
    assert ours.frequency[tables.LINK_DOWN].release_s == 172800
    assert ours.duration_rule(tables.GATEWAY_PROBE) is ld


def test_customization_validation_drops_only_bad_rules():
    c = Customization.from_obj(
        {
            "GraceTolerance": {"WaitDeviceResetTime": 10, "WaitProcessReadCMTime": 40},
            "FaultFrequency": [
                {"EventId": ["AA"], "TimeWindow": 30, "Times": 2, "FaultHandling": "ManuallySeparateNPU"},
                {"EventId": ["BB"], "TimeWindow": 600, "Times": 2, "FaultHandling": "RestartNPU"},
                {
                    "EventId": ["CC"],
                    "TimeWindow": 600,
                    "Times": 2,
                    "FaultHandling": "SeparateNPU",
                    "ReleaseTimeWindow": 600,
                },
                {
                    "EventId": ["cc"],
                    "TimeWindow": 900,
                    "Times": 9,
                    "FaultHandling": "SeparateNPU",
                    "ReleaseTimeWindow": 600,
                },
            ],
            "FaultDuration": [
                {
                    "EventId": ["DD"],
                    "FaultTimeout": 5,
                    "RecoverTimeout": 60,
                    "FaultHandling": "ManuallySeparateNPU",
                },
                {
                    "EventId": ["EE"],
                    "FaultTimeout": 700,
                    "RecoverTimeout": 60,
                    "FaultHandling": "SeparateNPU",
                },
                {"EventId": ["FF"], "FaultTimeout": 5, "RecoverTimeout": 60, "FaultHandling": "SeparateNPU"},
            ],
        }
    )
    assert c.grace.wait_device_reset_s == 150 and c.grace.wait_process_read_cm_s == 40
    assert set(c.frequency) == {0xCC} and c.frequency[0xCC].times == 2  # first rule per code wins
    assert set(c.duration) == {0xFF}
    assert len(c.rejected) == 5


def test_switch_table_default_agrees_with_reference(fault_tables):
    ours = SwitchFaultTable.load()
    ref = SwitchFaultTable.load(fault_tables / "SwitchFaultCode.json")
    raw = json.loads((fault_tables / "SwitchFaultCode.json").read_text())
    assert len(ref.levels) == sum(len(v) for v in raw.values())
    assert ours.levels == ref.levels
    assert ref.level("[0x00f1fef5,155914,npu,na]") == "RestartRequest"
    assert tables.switch_code(0x00F1FEF5, 155914, 1) == "[0x00f1fef5,155914,npu,na]"
    assert tables.switch_code(0x08520003, 0xFFFFFFFF, 2) == "[0x08520003,na,L2,na]"
    assert ref.level(tables.switch_code(0x08520003, 0xFFFFFFFF, 2)) == "NotHandle"
    bad = SwitchFaultTable.from_obj({"SeparateFaultCodes": ["[0x1,2]", 5, "[0x00f103b0,155907,na,na]"]})
    assert list(bad.levels) == ["[0x00f103b0,155907,na,na]"]


def test_grace_tolerance_settings_off_the_defaults_are_listed():
    """GraceTolerance drives deviced's --grace-tolerance flow only (deviced.grace, which warns when a
    setting off the defaults is given without it: tests/deviced/test_grace.py); the table lists them."""
    assert (
        Customization.from_obj(
            {"GraceTolerance": {"WaitProcessReadCMTime": 30, "WaitDeviceResetTime": 150}}
        ).ignored
        == []
    )
    c = Customization.from_obj(
        {"GraceTolerance": {"WaitDeviceResetTime": 120, "WaitFaultSelfHealingTime": 15}}
    )
    assert c.ignored == ["GraceTolerance.WaitDeviceResetTime=120"]
    assert (c.grace.wait_device_reset_s, c.grace.wait_self_healing_s) == (120, 15)
