"""Bad tables (issue 13 "Bad input"): unknown level names, wrong types, huge files, rules with a zero
or negative window are refused with the file, the key and why; a bad entry inside a good structure
is dropped with its reason; a live reload keeps the last good table and counts the failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import free_port, until

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend
from deviced.tables import (
    MAX_TABLE_BYTES,
    Customization,
    FaultCodeTable,
    SwitchFaultTable,
    TableError,
    load_fault_duration,
    load_relations,
)


@pytest.mark.parametrize(
    ("loader", "obj", "why"),
    [
        (FaultCodeTable, {"SeperateNPUCodes": ["80E18008"]}, "unknown key 'SeperateNPUCodes'"),
        (FaultCodeTable, {"SeparateNPUCodes": "80E18008"}, "SeparateNPUCodes: must be a list"),
        (FaultCodeTable, ["80E18008"], "top level must be an object"),
        (SwitchFaultTable, {"SeparateFault": []}, "unknown key 'SeparateFault'"),
        (SwitchFaultTable, {"SeparateFaultCodes": {"a": 1}}, "SeparateFaultCodes: must be a list"),
        (Customization, {"FaultFrequncy": []}, "unknown key 'FaultFrequncy'"),
        (Customization, {"FaultFrequency": {"EventId": ["80E18005"]}}, "FaultFrequency: must be a list"),
        (Customization, {"GraceTolerance": [1]}, "GraceTolerance: must be a object"),
    ],
)
def test_bad_structure_is_refused_naming_file_and_key(tmp_path, loader, obj, why):
    f = tmp_path / "table.json"
    f.write_text(json.dumps(obj))
    with pytest.raises(TableError, match=why) as e:
        loader.load(f)
    assert str(f) in str(e.value)


def test_huge_file_is_refused(tmp_path):
    f = tmp_path / "faultCode.json"
    f.write_text(json.dumps({"NotHandleFaultCodes": ["80E18008"] * (MAX_TABLE_BYTES // 10)}))
    for load in (
        FaultCodeTable.load,
        SwitchFaultTable.load,
        Customization.load,
        load_relations,
        load_fault_duration,
    ):
        with pytest.raises(TableError, match="larger than"):
            load(f)


def test_bad_entries_are_dropped_with_their_reason(caplog):
    t = FaultCodeTable.from_obj({"SeparateNPUCodes": ["80E18008", 12, "zz"], "RestartNPUCodes": ["80E18008"]})
    assert t.listed_level(0x80E18008).name == "SeparateNPU"  # precedence, reported below
    assert "fault code in several levels" in caplog.text and "fault code skipped" in caplog.text
    c = Customization.from_obj(
        {"FaultFrequency": [
            {"EventId": ["80E18005"], "TimeWindow": 0, "Times": 2, "FaultHandling": "SeparateNPU", "ReleaseTimeWindow": 600},
            {"EventId": ["80E18006"], "TimeWindow": -60, "Times": 2, "FaultHandling": "SeparateNPU", "ReleaseTimeWindow": 600},
            {"EventId": ["80E18007"], "TimeWindow": 600, "Times": 0, "FaultHandling": "SeparateNPU", "ReleaseTimeWindow": 600},
            {"EventId": ["80E18009"], "TimeWindow": 600, "Times": 2, "FaultHandling": "Explode", "ReleaseTimeWindow": 600},
            {"EventId": ["80E1800A"], "TimeWindow": 600, "Times": 2, "FaultHandling": "SeparateNPU", "ReleaseTimeWindow": 600},
        ],
         "FaultDuration": [{"EventId": ["81078603"], "FaultTimeout": -1, "RecoverTimeout": 60, "FaultHandling": "PreSeparateNPU"}]},
        "custom.json",
    )  # fmt: skip
    assert set(c.frequency) == {0x80E1800A} and not c.duration
    assert c.rejected == [
        "FaultFrequency[0]: TimeWindow 0 outside 60..864000",
        "FaultFrequency[1]: TimeWindow -60 outside 60..864000",
        "FaultFrequency[2]: Times 0 outside 1..100",
        "FaultFrequency[3]: FaultHandling 'Explode' unknown",
        "FaultDuration[0]: FaultTimeout -1 outside 0..600",
    ]
    assert "table=custom.json" in caplog.text


def test_bad_relation_and_deadline_entries(tmp_path):
    d = tmp_path / "faultDuration.json"
    d.write_text(
        json.dumps(
            [
                {"FaultCode": "81078603", "TimeOutInterval": -5},
                {"FaultCode": "81078603", "TimeOutInterval": "9"},
            ]
        )
    )
    assert load_fault_duration(d).timeouts == {} and len(load_fault_duration(d).rejected) == 2
    r = tmp_path / "relationFaultCustomization.json"
    r.write_text(
        json.dumps([{"TriggerFault": "8C1F860B", "RelationFaults": ["81078603"], "FaultStrategy": "Isolate"}])
    )
    assert load_relations(r).rules == [] and "FaultStrategy 'Isolate'" in load_relations(r).rejected[0]
    r.write_text(json.dumps({"TriggerFault": "8C1F860B"}))
    with pytest.raises(TableError, match="top level must be a list"):
        load_relations(r)


async def test_live_override_and_rejected_reload_keeps_last_good(tmp_path):
    codes, rel = tmp_path / "faultCode.json", tmp_path / "relationFaultCustomization.json"
    codes.write_text(json.dumps({"RestartBusinessCodes": ["80E18005"]}))
    rel.write_text(
        json.dumps(
            [{"TriggerFault": "8C1F860B", "RelationFaults": ["81078603"], "FaultStrategy": "Separate"}]
        )
    )
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}", "--probe-interval", "0",
         "--fault-code-file", str(codes), "--relation-fault-file", str(rel),
         "--table-reload-interval", "0.1", "--list-watch-period", "3"]
    )  # fmt: skip
    app = DeviceD(args, sim)
    await app.start()
    try:
        await until(lambda: app.cycles >= 1)
        sim.inject(1, 0x80E18005, 1)
        await until(lambda: app.state.devices[("NPU", 1)].level == "RestartBusiness")
        codes.write_text(json.dumps({"SeparateNPUCodes": ["80E18005"]}))  # takes effect without restart
        await until(lambda: app.state.devices[("NPU", 1)].level == "SeparateNPU")
        codes.write_text(json.dumps({"SeparateNPUCodez": ["80E18005"]}))  # refused: last good stays
        await until(lambda: app.reloader.failures["faultCode.json"] == 1)
        assert app.engine.table.listed_level(0x80E18005).name == "SeparateNPU"
        assert (
            app.registry.get_sample_value(
                "faultmesh_deviced_table_reload_failures_total", {"table": "faultCode.json"}
            )
            == 1
        )
        rel.write_text(json.dumps([]))  # the relation rules go live too
        await until(lambda: app.relations.relations.rules == [])
    finally:
        await app.stop()


def test_a_skipped_table_entry_is_logged_once_at_start(tmp_path):
    # tryout: deviced's main checked the tables (exit 2 on a bad file) and then loaded them again,
    # so every skipped entry was warned about twice
    import subprocess
    import sys
    import time

    table = json.loads((Path(__file__).parents[2] / "services/deviced/data/faultCode.json").read_text())
    key = next(k for k, v in table.items() if isinstance(v, list))
    table[key] = [*table[key], "zz-bad"]
    (tmp_path / "fc.json").write_text(json.dumps(table))
    log = tmp_path / "deviced.log"
    with open(log, "wb") as fh:
        p = subprocess.Popen(
            [sys.executable, "-m", "deviced", "--node-name", "n1", "--backend", "sim", "--clusterd",
             f"127.0.0.1:{free_port()}", "--http-addr", f"127.0.0.1:{free_port()}",
             "--fault-code-file", str(tmp_path / "fc.json")],
            stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while "clusterd stream down" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)  # started: past the table loads
        finally:
            p.terminate()
            p.wait(20)
    text = log.read_text()
    assert "clusterd stream down" in text, text
    assert text.count("fault code skipped") == 1 and "value=zz-bad" in text, text
