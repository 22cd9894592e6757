"""SEL records, cursor-based reading, the event table and active SEL faults (noded.bmc.sel)."""

from __future__ import annotations

import json
import struct
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faultmesh.levels import NodeLevel
from noded.bmc import sel


class NotPresent(Exception):
    code = 0xCB


class FakeSel:
    """An in-memory SEL answering Get SEL Info / Get SEL Entry like a BMC."""

    def __init__(self):
        self.records: dict[int, bytes] = {}
        self.next_id = 1
        self.add_ts = 0
        self.erase_ts = 100
        self.entry_reads = 0

    def add(self, rec: bytes) -> int:
        rid = self.next_id
        self.next_id += 1
        self.add_ts += 1
        self.records[rid] = struct.pack("<H", rid) + rec[2:]
        return rid

    def clear(self):
        self.records.clear()
        self.erase_ts += 1

    def raw(self, netfn: int, cmd: int, data: bytes) -> bytes:
        assert netfn == sel.NETFN_STORAGE
        if cmd == sel.CMD_GET_SEL_INFO:
            return sel.encode_sel_info(
                sel.SelInfo(0x51, len(self.records), 1000, self.add_ts, self.erase_ts, 0x0A)
            )
        if cmd == sel.CMD_GET_SEL_ENTRY:
            self.entry_reads += 1
            rid = struct.unpack_from("<H", data, 2)[0]
            ids = list(self.records)
            if rid == 0 and ids:
                rid = ids[0]
            if rid not in self.records:
                raise NotPresent()
            i = ids.index(rid)
            nxt = ids[i + 1] if i + 1 < len(ids) else 0xFFFF
            return struct.pack("<H", nxt) + self.records[rid]
        raise AssertionError(cmd)


def ev(sensor_type, num, offset, **kw):
    return sel.make_event_record(sensor_type, num, offset, **kw)


def default_table() -> sel.SelEventTable:
    return sel.SelEventTable.from_json(resources.files("noded").joinpath("sel_events.json").read_bytes())


def test_record_layout():
    raw = ev(0x0C, 0x10, 0x01, record_id=7, timestamp=0x01020304)
    assert len(raw) == 16
    r = sel.parse_record(raw)
    assert (r.record_id, r.record_type, r.timestamp, r.generator_id) == (7, 2, 0x01020304, 0x20)
    assert (r.sensor_type, r.sensor_num, r.event_type, r.deassert, r.offset) == (0x0C, 0x10, 0x6F, False, 1)
    d = sel.parse_record(ev(0x0C, 0x10, 0x01, deassert=True))
    assert d.deassert and d.event_type == 0x6F
    with pytest.raises(sel.SelError):
        sel.parse_record(raw[:15])


@given(st.binary(min_size=16, max_size=16))
def test_property_any_16_bytes_parse(raw):
    r = sel.parse_record(raw)
    assert 0 <= r.offset <= 15 and 0 <= r.event_type <= 0x7F


def test_cursor_reads_each_event_once_and_detects_clear():
    bmc = FakeSel()
    recs, cur, cleared = sel.read_new_records(bmc.raw, sel.SelCursor())
    assert recs == [] and not cleared
    bmc.add(ev(0x0C, 1, 1))
    bmc.add(ev(0x07, 0, 0))
    recs, cur, cleared = sel.read_new_records(bmc.raw, cur)
    assert [r.record_id for r in recs] == [1, 2] and not cleared
    reads = bmc.entry_reads
    recs, cur, _ = sel.read_new_records(bmc.raw, cur)
    assert recs == [] and bmc.entry_reads == reads + 1  # nothing added: SEL info + the cursor's record
    bmc.add_ts -= 1  # a BMC with a 1 s clock: the next event gets the same "last add" time
    bmc.add(ev(0x0C, 1, 1, deassert=True))
    recs, cur, _ = sel.read_new_records(bmc.raw, cur)
    assert [r.deassert for r in recs] == [True]
    bmc.add(ev(0x08, 2, 1))
    recs, cur, _ = sel.read_new_records(bmc.raw, cur)
    assert [r.record_id for r in recs] == [4]
    bmc.clear()
    bmc.add(ev(0x0D, 4, 1))
    recs, cur, cleared = sel.read_new_records(bmc.raw, cur)
    assert cleared and [r.record_id for r in recs] == [5]


def test_cursor_record_gone_without_erase_time_means_cleared():
    bmc = FakeSel()
    bmc.add(ev(0x0C, 1, 1))
    _, cur, _ = sel.read_new_records(bmc.raw, sel.SelCursor())
    bmc.records.clear()  # a BMC that does not keep an erase time
    bmc.add(ev(0x0C, 2, 1))
    recs, cur, cleared = sel.read_new_records(bmc.raw, sel.SelCursor(cur.last_id, None, None))
    assert cleared and [r.sensor_num for r in recs] == [2]


def test_looping_next_record_chain_rejected():
    bmc = FakeSel()
    bmc.add(ev(0x0C, 1, 1))

    def raw(netfn, cmd, data):
        if cmd == sel.CMD_GET_SEL_ENTRY:
            return struct.pack("<H", 1) + bmc.records[1]  # next always points back at record 1
        return bmc.raw(netfn, cmd, data)

    with pytest.raises(sel.SelError) as e:
        sel.read_new_records(raw, sel.SelCursor())
    assert e.value.reason == "loop"


def test_short_replies_rejected():
    with pytest.raises(sel.SelError):
        sel.parse_sel_info(b"\x51\x00")

    def raw(netfn, cmd, data):
        if cmd == sel.CMD_GET_SEL_INFO:
            return sel.encode_sel_info(sel.SelInfo(0x51, 1, 0, 1, 1, 0))
        return b"\xff\xff\x01"

    with pytest.raises(sel.SelError) as e:
        sel.read_new_records(raw, sel.SelCursor())
    assert e.value.reason == "short"


def test_default_table_covers_the_issue_list():
    t = default_table()
    want = {
        "memory ECC": (0x0C, 0x6F, 0x01),
        "CPU IERR": (0x07, 0x6F, 0x00),
        "CPU MCE": (0x07, 0x6F, 0x0B),
        "PSU failure": (0x08, 0x6F, 0x01),
        "fan failure": (0x04, 0x01, 0x02),
        "temperature critical": (0x01, 0x01, 0x09),
        "drive fault": (0x0D, 0x6F, 0x01),
    }
    for what, key in want.items():
        rule = t.rules.get(key)
        assert rule is not None, what
        assert rule.level >= NodeLevel.PreSeparateFault, what
    assert t.rules[(0x07, 0x6F, 0x00)].level == NodeLevel.SeparateFault
    assert t.rules[(0x0C, 0x6F, 0x00)].level == NodeLevel.NotHandleFault  # correctable ECC


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (
            [{"SensorType": "0x0C", "Offsets": ["0x01"], "FaultCode": "F10C", "FaultLevel": "SeparateFault"}],
            "FaultCode",
        ),
        (
            [{"SensorType": "0x0C", "Offsets": ["0x01"], "FaultCode": "F10C6F01", "FaultLevel": "Bad"}],
            "level",
        ),
        (
            [{"SensorType": "0x0C", "Offsets": [], "FaultCode": "F10C6F01", "FaultLevel": "SeparateFault"}],
            "Offsets",
        ),
        (
            [
                {
                    "SensorType": "0x1FF",
                    "Offsets": ["0x01"],
                    "FaultCode": "F10C6F01",
                    "FaultLevel": "SeparateFault",
                }
            ],
            "out of range",
        ),
        (
            [
                {
                    "SensorType": "0x0C",
                    "Offsets": ["0x01"],
                    "FaultCode": "F10C6F01",
                    "FaultLevel": "SeparateFault",
                }
            ]
            * 2,
            "twice",
        ),
    ],
)
def test_bad_tables_rejected(rows, needle):
    with pytest.raises(sel.SelTableError, match=needle):
        sel.SelEventTable.from_json(json.dumps({"SelEvents": rows}))


def test_tracker_assert_deassert_clear_and_skips():
    t = default_table()
    tr = sel.SelFaultTracker()
    recs = [
        sel.parse_record(r)
        for r in (
            ev(0x0C, 0x10, 0x01),  # memory UE on DIMM sensor 0x10
            ev(0x0C, 0x11, 0x01),  # another DIMM
            ev(0x0C, 0x10, 0x01, deassert=True),  # first one recovers
            ev(0x99, 0x01, 0x03),  # unmapped
            bytes((1, 0, 0xC1)) + bytes(13),  # OEM record
            bytes((2, 0, 0x05)) + bytes(13),  # unknown record type
        )
    ]
    counts = tr.apply(t, recs, cleared=False)
    assert counts == {"mapped": 3, "unmapped": 1, "oem": 1, "unknown_type": 1}
    assert list(tr.active) == [("Memory", 0x11, "F10C6F01")]
    tr.apply(t, [], cleared=True)
    assert tr.active == {}
