"""NodeD level table: format, validation, default table vs the reference, reload on change (noded.md §2)."""

from __future__ import annotations

import json
import os

import pytest

from faultmesh.levels import NodeLevel
from noded.levels import LevelTable, LevelTableError, LevelTableWatcher, node_status


def _table(nh=(), pre=(), sep=()):
    return json.dumps(
        {
            "FaultTypeCode": {
                "NotHandleFaultCodes": list(nh),
                "PreSeparateFaultCodes": list(pre),
                "SeparateFaultCodes": list(sep),
            }
        }
    )


def test_default_table_matches_reference(fault_tables):
    ref = LevelTable.load(fault_tables / "NodeDConfiguration.json")
    ours = LevelTable.default()
    assert ours.levels == ref.levels
    assert len(ours) == 59
    counts = {k: len(v) for k, v in ours.by_level().items()}
    assert counts == {"NotHandleFaultCodes": 7, "PreSeparateFaultCodes": 51, "SeparateFaultCodes": 1}


def test_default_table_is_not_a_copy_of_the_reference_file(fault_tables):
    ours = LevelTable.default()
    ref_bytes = (fault_tables / "NodeDConfiguration.json").read_bytes()
    assert ours.digest != LevelTable.from_json(ref_bytes).digest


def test_classify_known_and_unknown():
    t = LevelTable.default()
    assert t.classify("2C000031") == (NodeLevel.SeparateFault, True)
    assert t.classify("0800004b") == (NodeLevel.PreSeparateFault, True)
    assert t.classify("0100000D") == (NodeLevel.NotHandleFault, True)
    assert t.classify("DEADBEEF") == (NodeLevel.NotHandleFault, False)


def test_codes_upper_cased_and_deduplicated():
    t = LevelTable.from_json(_table(pre=["0800004b", "0800004B"], sep=["2c000031"]))
    assert t.levels == {"0800004B": NodeLevel.PreSeparateFault, "2C000031": NodeLevel.SeparateFault}


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (_table(pre=["0800004"]), "not 8 letters/digits"),
        (_table(pre=["0800004B0"]), "not 8 letters/digits"),
        (_table(pre=["0800-04B"]), "not 8 letters/digits"),
        (_table(pre=[12345678]), "not 8 letters/digits"),
        (_table(pre=["0800004B"], sep=["0800004b"]), "in two levels"),
        (json.dumps({"FaultTypeCode": {"SeparateFaultCodes": "2C000031"}}), "must be a list"),
        (json.dumps({"Codes": {}}), "FaultTypeCode"),
        (json.dumps({"FaultTypeCode": {"SeperateFaultCodes": []}}), "unknown key 'SeperateFaultCodes'"),
        ("{not json", "not JSON"),
    ],
)
def test_invalid_tables_rejected(doc, needle):
    with pytest.raises(LevelTableError, match=needle):
        LevelTable.from_json(doc)


def test_huge_table_rejected(tmp_path):
    from noded.levels import MAX_TABLE_BYTES

    f = tmp_path / "NodeDConfiguration.json"
    f.write_text(_table(pre=["0800004B"] * (MAX_TABLE_BYTES // 10)))
    with pytest.raises(LevelTableError, match="larger than"):
        LevelTable.load(f)


def test_node_status_from_worst_level():
    assert node_status([]) == "Healthy"
    assert node_status([NodeLevel.NotHandleFault]) == "Healthy"
    assert node_status([NodeLevel.NotHandleFault, NodeLevel.PreSeparateFault]) == "PreSeparate"
    assert node_status([NodeLevel.SeparateFault, NodeLevel.PreSeparateFault]) == "UnHealthy"


def _write(path, text):
    path.write_text(text)
    # make sure the stat changes even on coarse-mtime filesystems
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_reload_on_change_and_bad_table_keeps_old(tmp_path):
    f = tmp_path / "levels.json"
    _write(f, _table(pre=["0800004B"]))
    seen = []
    rejects = []
    w = LevelTableWatcher(str(f), on_change=seen.append, on_reject=rejects.append)
    assert w.table.classify("0800004B") == (NodeLevel.PreSeparateFault, True)
    assert w.check() is False  # unchanged

    _write(f, _table(sep=["0800004B"]))
    assert w.check() is True
    assert w.table.classify("0800004B") == (NodeLevel.SeparateFault, True)
    assert len(seen) == 1

    _write(f, _table(pre=["0800004B"], sep=["0800004B"]))  # conflict -> rejected, old kept
    assert w.check() is False
    assert w.table.classify("0800004B") == (NodeLevel.SeparateFault, True)
    assert w.rejected == 1 and rejects == ["invalid"]

    f.unlink()
    assert w.check() is False
    assert w.table.classify("0800004B") == (NodeLevel.SeparateFault, True)
    assert rejects == ["invalid", "missing"]

    _write(f, _table(nh=["0800004B"]))
    assert w.check() is True
    assert w.table.classify("0800004B") == (NodeLevel.NotHandleFault, True)


def test_bad_table_at_startup_falls_back_to_default_until_fixed(tmp_path):
    f = tmp_path / "levels.json"
    f.write_text(_table(pre=["bad"]))
    rejects = []
    w = LevelTableWatcher(str(f), on_reject=rejects.append)
    assert w.table.levels == LevelTable.default().levels
    assert rejects == ["invalid"] and w.rejected == 1
    _write(f, _table(sep=["0800004B"]))
    assert w.check() is True
    assert w.table.levels == {"0800004B": NodeLevel.SeparateFault}


async def test_watcher_run_picks_up_change(tmp_path):
    import asyncio

    f = tmp_path / "levels.json"
    _write(f, _table(pre=["0800004B"]))
    changed = asyncio.Event()
    w = LevelTableWatcher(str(f), on_change=lambda t: changed.set())
    task = asyncio.create_task(w.run(interval_s=0.05))
    try:
        _write(f, _table(sep=["0800004B"]))
        await asyncio.wait_for(changed.wait(), 5)
        assert w.table.classify("0800004B")[0] == NodeLevel.SeparateFault
    finally:
        task.cancel()


def test_a_configmap_table_wins_over_the_file(tmp_path):
    """``apply_text`` (noded --kube: mindx-dl-node-fault-config) is in force over the file; the
    file is no longer applied; a bad text is refused and counted (reference noded.md §2)."""
    f = tmp_path / "levels.json"
    _write(f, _table(pre=["0800004B"]))
    seen, rejects = [], []
    w = LevelTableWatcher(str(f), on_change=seen.append, on_reject=rejects.append)
    assert w.apply_text(_table(sep=["0800004B"]), "cm") is True
    assert w.table.classify("0800004B") == (NodeLevel.SeparateFault, True) and len(seen) == 1
    _write(f, _table(nh=["0800004B"]))
    assert w.check() is False  # the ConfigMap's table stays
    assert w.table.classify("0800004B") == (NodeLevel.SeparateFault, True)
    assert w.apply_text(_table(sep=["0800004B"])[:-3], "cm") is False
    assert w.apply_text(_table(sep=["0800004B"]) + " " * 300, "cm", max_bytes=64) is False
    assert w.rejected == 2 and rejects == ["invalid", "invalid"]
    assert w.apply_text(_table(sep=["0800004B"]), "cm") is False  # the same table: no change
    assert len(seen) == 1
