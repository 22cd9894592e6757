"""faultDuration.json and relationFaultCustomization.json parsers (faultmesh.faultrules; reference
clusterd.md §6.3): shapes, both strategy spellings, canonical codes, bad entries dropped with reasons."""

from __future__ import annotations

import pytest

from faultmesh.faultrules import DurationTable, RelationTable, RuleTableError, canonical_code


def test_canonical_code():
    assert canonical_code("0x80e18008") == "80E18008"
    assert canonical_code(" [0x08520003,NA,l2,na] ") == "[0x08520003,na,L2,na]"
    assert canonical_code("[0x08520003,,L2,na]") == "[0x08520003,na,L2,na]"  # the repo's older spelling
    for bad in ("", "zz", "[0x0852,na,L2,na]", "[0x08520003,na,L3,na]", 5, None, "1" * 17):
        with pytest.raises(ValueError):
            canonical_code(bad)


def test_duration_table_validation():
    t = DurationTable.from_obj(
        [
            {"FaultCode": "81078603", "FaultType": "faultDevice", "TimeOutInterval": 300},
            {"FaultCode": "[0x08520003,na,L2,na]", "TimeOutInterval": 0},  # type inferred
            {"FaultCode": "81078603", "FaultType": "faultDevice", "TimeOutInterval": 5},  # duplicate
            {"FaultCode": "80E18008", "FaultType": "faultDevice", "TimeOutInterval": -1},
            {"FaultCode": "80E18008", "FaultType": "faultDevice", "TimeOutInterval": True},
            {"FaultCode": "80E18008", "FaultType": "faultDisk", "TimeOutInterval": 3},
            {"FaultCode": "xyz", "TimeOutInterval": 3},
            "not an object",
        ]
    )
    assert t.timeout_s("0x81078603") == 300
    assert t.timeouts["[0x08520003,na,L2,na]"].fault_type == "faultSwitch"
    assert t.timeout_s("80E18008") == 0 and t.timeout_s("garbage") == 0
    assert len(t.rejected) == 6
    with pytest.raises(RuleTableError):
        DurationTable.from_obj({"FaultCode": "81078603"})


def test_relation_table_validation():
    t = RelationTable.from_obj(
        [
            {"TriggerFault": "8C1F8609", "RelationFaults": ["81078603"], "FaultStrategy": "SubHealth"},
            {
                "TriggerFault": "8c1f860b",
                "RelationFaults": ["[0x08520003,,L2,na]"],
                "DeviceStrategy": "Separate",
            },
            {"TriggerFault": "8C1F8609", "RelationFaults": ["81078603"], "FaultStrategy": "SubHealth"},  # dup
            {"TriggerFault": "8C1F8609", "RelationFaults": [], "FaultStrategy": "SubHealth"},
            {"TriggerFault": "8C1F8609", "RelationFaults": ["81078603"], "FaultStrategy": "Isolate"},
            {
                "TriggerFault": "[0x08520003,na,L2,na]",
                "RelationFaults": ["81078603"],
                "FaultStrategy": "Separate",
            },
            {"TriggerFault": "8C1F8609", "RelationFaults": ["bad code"], "FaultStrategy": "Separate"},
        ]
    )
    assert [(r.trigger, r.relations, r.strategy) for r in t.rules] == [
        ("8C1F8609", ("81078603",), "SubHealth"),
        ("8C1F860B", ("[0x08520003,na,L2,na]",), "Separate"),
    ]
    assert len(t.rejected) == 5
    assert [r.trigger for r in t.involving("[0x08520003,NA,L2,na]")] == ["8C1F860B"]
    assert t.involving("not a code") == []
    with pytest.raises(RuleTableError):
        RelationTable.from_obj({"rules": []})
