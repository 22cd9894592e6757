"""Huawei iBMC OEM alarm codec and paging (reference noded.md §1), with hypothesis properties."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noded.bmc import oem
from noded.bmc.oem import AlarmRecord, OemReplyError

records_st = st.builds(
    AlarmRecord,
    code=st.integers(0, 0xFFFFFFFF).map(lambda v: f"{v:08X}"),
    severity=st.integers(0, 255),
    type_byte=st.integers(0, 255),
    device_id=st.integers(0, 255),
)


def test_request_bytes_match_reference():
    # reference ipmi_monitor_test.go: raw frame 30 94 DB 07 00 40 00 00 00 0E FF (netfn, cmd, data)
    assert bytes((oem.NETFN, oem.CMD)) + oem.build_request(0) == bytes.fromhex(
        "3094DB070040000000 0EFF".replace(" ", "")
    )
    assert oem.build_request(14)[5:7] == b"\x0e\x00"
    assert oem.build_request(0x1234)[5:7] == b"\x34\x12"


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(-1, "0000"), (0, "0000"), (1, "0100"), (255, "ff00"), (256, "0001"), (65535, "ffff"), (65536, "0000")],
)
def test_index_encoding(value, encoded):
    assert oem.encode_index(value).hex() == encoded


def test_record_code_is_reversed_upper_hex():
    rec = bytes.fromhex("3100002C") + b"\x11\x22\x33\x44" + bytes((2, 0x02, 7)) + b"\x00" * 4
    r = oem.parse_record(rec)
    assert r == AlarmRecord("2C000031", 2, 0x02, 7)
    assert r.device_type == "Disk"


def test_device_type_table():
    assert oem.device_type_name(0x00) == "CPU"
    assert oem.device_type_name(0x01) == "Memory"
    assert oem.device_type_name(0x2C) == "System"
    assert oem.device_type_name(0x56) == "NPU"
    assert oem.device_type_name(0xC4) == "CLU"
    assert oem.device_type_name(0x5E) == "UNKNOWN"
    assert oem.device_type_name(0xFF) == "UNKNOWN"
    assert oem.device_type_byte("memory") == 0x01
    assert oem.device_type_byte("PCIe Card") == 0x08
    assert oem.device_type_byte("0x56") == 0x56
    with pytest.raises(ValueError):
        oem.device_type_byte("Toaster")


def test_parse_reply_header_and_records():
    recs = [AlarmRecord("0800004B", 1, 0x01, 3), AlarmRecord("2C000031", 3, 0x02, 1)]
    page = oem.parse_reply(oem.encode_reply(5, recs, more=True))
    assert page.total == 5 and page.flag == 1 and page.records == recs


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "short"),
        (bytes.fromhex("db0700010000"), "short"),
        (bytes.fromhex("db0800000000 00".replace(" ", "")), "iana"),
        (bytes.fromhex("db070001000100") + b"\x00" * 14, "ragged"),
        (bytes.fromhex("db0700010000 00".replace(" ", "")) + b"\x00" * 15, "count"),
        (bytes.fromhex("db0700010002 00".replace(" ", "")) + b"\x00" * 15, "count"),
    ],
)
def test_parse_reply_rejections(data, reason):
    with pytest.raises(OemReplyError) as e:
        oem.parse_reply(data)
    assert e.value.reason == reason


def test_reference_fixture_with_inconsistent_count_is_rejected():
    # reference ipmi_monitor_test.go's first reply: total 256, count byte 0, one record present.
    # The reference parses it; faultmesh rejects an inconsistent reply (issue 3 "Bad input").
    data = bytes((0xDB, 0x07, 0x00, 0x00, 0x01, 0x00, 0x00)) + bytes(range(15))
    with pytest.raises(OemReplyError) as e:
        oem.parse_reply(data)
    assert e.value.reason == "count"


class FakeIbmc:
    """Answers get-current-alarms requests from a list, ``page`` records per reply."""

    def __init__(self, alarms, page=14):
        self.alarms = list(alarms)
        self.page = page
        self.indexes = []

    def __call__(self, req: bytes) -> bytes:
        index = oem.parse_request(req)
        self.indexes.append(index)
        chunk = self.alarms[index : index + self.page]
        return oem.encode_reply(len(self.alarms), chunk, more=index + len(chunk) < len(self.alarms))


def test_paging_walks_index_by_count():
    alarms = [AlarmRecord(f"0800{i:04X}", 1, 0x08, i % 256) for i in range(40)]
    bmc = FakeIbmc(alarms)
    assert oem.read_alarms(bmc) == alarms
    assert bmc.indexes == [0, 14, 28]


def test_no_alarms_is_one_request():
    bmc = FakeIbmc([])
    assert oem.read_alarms(bmc) == []
    assert bmc.indexes == [0]


def test_paging_limit_of_100_followups():
    # one record per page: 101 alarms need exactly 100 follow-ups, 102 need 101 -> rejected
    ok = FakeIbmc([AlarmRecord(f"{i:08X}", 0, 0, 0) for i in range(101)], page=1)
    assert len(oem.read_alarms(ok)) == 101
    assert len(ok.indexes) == 101
    too_many = FakeIbmc([AlarmRecord(f"{i:08X}", 0, 0, 0) for i in range(102)], page=1)
    with pytest.raises(OemReplyError) as e:
        oem.read_alarms(too_many)
    assert e.value.reason == "pages"
    assert len(too_many.indexes) == 101


def test_absurd_total_rejected_before_paging():
    calls = []

    def bmc(req):
        calls.append(req)
        return oem.IANA_BYTES + struct.pack("<HBB", 60000, 0, 0)

    with pytest.raises(OemReplyError) as e:
        oem.read_alarms(bmc)
    assert e.value.reason == "total"
    assert len(calls) == 1


def test_stalled_followup_rejected():
    def bmc(req):
        index = oem.parse_request(req)
        if index == 0:
            return oem.encode_reply(3, [AlarmRecord("00000003", 1, 0, 0)])
        return oem.encode_reply(3, [])

    with pytest.raises(OemReplyError) as e:
        oem.read_alarms(bmc)
    assert e.value.reason == "stalled"


def test_overrun_rejected():
    def bmc(req):
        return oem.encode_reply(
            2, [AlarmRecord("00000003", 1, 0, 0)] * 2 if oem.parse_request(req) == 0 else []
        )

    assert len(oem.read_alarms(bmc)) == 2  # exact: fine

    def bmc2(req):
        index = oem.parse_request(req)
        n = 1 if index == 0 else 2
        return oem.encode_reply(2, [AlarmRecord("00000003", 1, 0, 0)] * n)

    with pytest.raises(OemReplyError) as e:
        oem.read_alarms(bmc2)
    assert e.value.reason == "overrun"


def test_error_on_followup_discards_the_poll():
    class Boom(Exception):
        pass

    def bmc(req):
        if oem.parse_request(req) == 0:
            return oem.encode_reply(20, [AlarmRecord("00000003", 1, 0, 0)] * 14)
        raise Boom()

    with pytest.raises(Boom):
        oem.read_alarms(bmc)


@given(st.integers(0, 0xFFFF), st.lists(records_st, max_size=14), st.booleans())
def test_property_reply_roundtrip(total, recs, more):
    page = oem.parse_reply(oem.encode_reply(total, recs, more))
    assert page.total == total
    assert page.records == recs
    assert page.flag == (1 if more else 0)


@given(st.binary(max_size=300))
def test_property_arbitrary_reply_never_crashes(data):
    try:
        page = oem.parse_reply(data)
    except OemReplyError as e:
        assert e.reason in {"short", "iana", "ragged", "count"}
        return
    assert len(data) == oem.HEADER_LEN + 15 * len(page.records)
    for r in page.records:
        assert len(r.code) == 8 and r.code == r.code.upper()
        int(r.code, 16)


@settings(max_examples=60)
@given(st.lists(records_st, max_size=300), st.integers(1, 14))
def test_property_paging_returns_every_alarm(alarms, page):
    bmc = FakeIbmc(alarms, page=page)
    need_followups = max(0, -(-len(alarms) // page) - 1)
    if need_followups > oem.MAX_FOLLOWUPS:
        with pytest.raises(OemReplyError):
            oem.read_alarms(bmc)
        return
    assert oem.read_alarms(bmc) == alarms
    assert bmc.indexes == list(range(0, max(len(alarms), 1), page))


@settings(max_examples=150)
@given(st.data())
def test_property_hostile_bmc_gives_result_or_counted_rejection(data):
    calls = []

    def bmc(req):
        calls.append(oem.parse_request(req))
        if data.draw(st.booleans()):
            total = data.draw(st.integers(0, 0xFFFF))
            recs = data.draw(st.lists(records_st, max_size=14))
            return oem.encode_reply(total, recs)
        return data.draw(st.binary(max_size=230))

    try:
        recs = oem.read_alarms(bmc)
    except OemReplyError:
        pass
    else:
        assert len(recs) <= oem.MAX_TOTAL
    assert len(calls) <= 1 + oem.MAX_FOLLOWUPS
    assert all(0 <= i <= 0xFFFF for i in calls)
