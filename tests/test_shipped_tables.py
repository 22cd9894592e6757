"""faultmesh's shipped default tables hold every code and every rule of the reference's defaults
(../shared/data/fault-tables), compared for equality code by code and rule by rule, through the
services' own loaders; and the core knowledge view (faultmesh.faultinfo) agrees with those loaders
for every code (issue 13; design.md "Fault model").

Extra codes in faultmesh's tables would be allowed by the reference comparison only if listed here;
there are none today.
"""

from __future__ import annotations

import json

import pytest
from support import FAULT_TABLES

from clusterd.api.pubfault import DEFAULT_TABLE as PUBLIC_DEFAULT
from clusterd.api.pubfault import PublicFaultTable
from deviced import tables
from deviced.tables import Customization, FaultCodeTable, SwitchFaultTable
from faultmesh import faultinfo
from noded.levels import LevelTable

pytestmark = pytest.mark.skipif(
    not FAULT_TABLES.is_dir(),
    reason=f"reference tables not found at {FAULT_TABLES} (the repo root's parent has no shared/; "
    "set FAULTMESH_SHARED to the shared folder)",
)


def _ref(name: str):
    return FAULT_TABLES / name


def test_fault_codes_every_code_same_level():
    ours, ref = FaultCodeTable.load(), FaultCodeTable.load(_ref("faultCode.json"))
    assert ours._level == ref._level  # every code, its level (bucket precedence applied)
    assert ours.network_buckets == ref.network_buckets
    raw = json.loads(_ref("faultCode.json").read_text())
    assert len(ours) == len({c.upper() for v in raw.values() for c in v}) == 802
    for level, codes in ref.buckets.items():  # every bucket listing survives, except a lower
        for c in codes - ours.buckets[level]:  # duplicate of a code whose higher bucket wins
            assert ours.listed_level(c) > level, (ours.spelling(c), level.name)


def test_fault_codes_spelled_as_reference():
    ours, ref = FaultCodeTable.load(), FaultCodeTable.load(_ref("faultCode.json"))
    assert {c: ours.spelling(c) for c in ours._level} == {c: ref.spelling(c).upper() for c in ref._level}


def test_customization_every_rule_equal():
    ours, ref = Customization.load(), Customization.load(_ref("faultCustomization.json"))
    assert not ours.rejected and not ref.rejected
    assert ours.grace == ref.grace
    assert ours.frequency == ref.frequency
    assert ours.duration == ref.duration
    assert len(ours.frequency) == 43 and set(ours.duration) == {tables.LINK_DOWN}


def test_switch_codes_every_code_same_level():
    ours, ref = SwitchFaultTable.load(), SwitchFaultTable.load(_ref("SwitchFaultCode.json"))
    assert ours.levels == ref.levels and len(ours.levels) == 30


def test_fault_duration_every_entry_equal():
    ours, ref = tables.load_fault_duration(), tables.load_fault_duration(_ref("faultDuration.json"))
    assert not ours.rejected and not ref.rejected
    assert ours.timeouts == ref.timeouts
    assert ours.timeout_s("81078603") == ours.timeout_s("[0x08520003,na,L2,na]") == 300
    assert ours.timeout_s("80E18008") == 0  # no entry: 0 s deadline (clusterd.md §6.3)


def test_relation_rules_every_rule_equal():
    ours, ref = tables.load_relations(), tables.load_relations(_ref("relationFaultCustomization.json"))
    assert not ours.rejected and not ref.rejected
    assert ours.rules == ref.rules and len(ours.rules) == 5


def test_noded_levels_every_code_same_level():
    assert LevelTable.default().levels == LevelTable.load(_ref("NodeDConfiguration.json")).levels


def test_public_faults_every_code_and_sender_equal():
    ours, ref = (
        PublicFaultTable.load(PUBLIC_DEFAULT),
        PublicFaultTable.load(_ref("publicFaultConfiguration.json")),
    )
    assert ours.levels == ref.levels and ours.resources == ref.resources


def test_faultinfo_levels_agree_with_service_loaders():
    """The CLI's core view of the shipped tables gives each code the level its service gives it."""
    chip = FaultCodeTable.load()
    for code, level in chip._level.items():
        got = {lv.table: lv.level for lv in faultinfo.levels(chip.spelling(code))}
        assert got["faultCode.json"] == level.name, chip.spelling(code)
    for code, level in SwitchFaultTable.load().levels.items():
        got = {lv.table: lv.level for lv in faultinfo.levels(code)}
        assert got["SwitchFaultCode.json"] == level, code
    for code, level in LevelTable.default().levels.items():
        got = {lv.table: lv.level for lv in faultinfo.levels(code)}
        assert got["NodeDConfiguration.json"] == level.name, code
    for code, level in PublicFaultTable.load(PUBLIC_DEFAULT).levels.items():
        got = {lv.table: lv.level for lv in faultinfo.levels(code)}
        assert got["publicFaultConfiguration.json"] == level, code


def test_faultinfo_rules_agree_with_service_loaders():
    custom = Customization.load()
    for code, rule in custom.frequency.items():
        (r,) = faultinfo.explain(f"{code:08X}").frequency
        assert (r["TimeWindow"], r["Times"], r["FaultHandling"]) == (
            rule.window_s,
            rule.times,
            rule.level.name,
        )
    ex = faultinfo.explain("81078603")
    assert (
        ex.duration == [{"FaultTimeout": 20, "RecoverTimeout": 60, "FaultHandling": "PreSeparateNPU"}]
        and ex.timeout.timeout_s == 300
    )
    assert len(ex.relations) == 4 and not ex.missing_tables


def test_every_meaning_names_a_listed_code():
    """Each code faultmesh describes is in some shipped table (no stale descriptions)."""
    for code in faultinfo._knowledge()["codes"]:
        assert faultinfo.levels(code), code
