"""faultmesh.dcmi.api / lingqu against the compiled test libraries: ids, codes, real C-thread callbacks."""

from __future__ import annotations

import ctypes
import threading

import pytest

from faultmesh.dcmi import DeviceNotReady, api, lingqu


@pytest.fixture
def dcmi(native_libs):
    d = api.Dcmi.open(native_libs.dcmi)
    d.lib.symbol("dcmitest_reset", None, ctypes.c_int, ctypes.c_int)(2, 4)
    return d


def ctl(d, name, *argtypes, restype=ctypes.c_int):
    return d.lib.symbol(name, restype, *argtypes)


def test_device_walk_and_id_maps(dcmi):
    ctl(dcmi, "dcmitest_set_phy", ctypes.c_int, ctypes.c_int)(5, 12)
    dcmi.init()
    devs = dcmi.devices()
    assert [d.logic for d in devs] == list(range(8))
    assert devs[5] == api.DeviceIds(logic=5, phy=12, card=1, device=1)
    assert dcmi.card_device(6) == (1, 2)
    assert dcmi.logic_from_phy(12) == 5
    assert dcmi.chip_name(0, 0) == "910B3"


def test_error_codes_health_and_card_drop(dcmi):
    codes = (ctypes.c_uint * 3)(0x80E18008, 0, 0x81078603)
    ctl(dcmi, "dcmitest_set_codes", ctypes.c_int, ctypes.c_void_p, ctypes.c_int)(1, codes, 3)
    assert dcmi.error_codes(0, 1) == [0x80E18008, 0x81078603]  # zero dropped
    assert dcmi.health(0, 1) != 0 and dcmi.health(0, 2) == 0
    ctl(dcmi, "dcmitest_set_rc", ctypes.c_char_p, ctypes.c_int, ctypes.c_int)(
        b"dcmi_get_device_health", 2, -8012
    )
    with pytest.raises(DeviceNotReady):
        dcmi.health(0, 2)


def test_subscription_callback_arrives_from_c_thread(dcmi):
    got: list[tuple[api.DevFaultEvent, int]] = []
    done = threading.Event()

    def on_event(ev):
        got.append((ev, threading.get_ident()))
        done.set()

    dcmi.subscribe(on_event)
    fire = ctl(
        dcmi,
        "dcmitest_fire",
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    )
    assert fire(3, 0x80E18008, 1, 2, 1, 1) == 0
    assert done.wait(5)
    ev, tid = got[0]
    assert tid != threading.get_ident()
    assert (ev.event_id, ev.logic_id, ev.assertion, ev.severity) == (0x80E18008, 3, 1, 2)
    assert ev.event_name == "test event"
    assert dcmi.error_codes(0, 3) == [0x80E18008]  # update_list applied the occur


def test_lingqu_subscribe_and_query(native_libs):
    lq = lingqu.Lingqu.open(native_libs.lingqu)
    lq.lib.symbol("lqtest_reset", None)()
    lq.init()
    got = []
    lq.subscribe(got.append)
    fire = lq.lib.symbol("lqtest_fire", ctypes.c_int, *[ctypes.c_int, ctypes.c_uint] + [ctypes.c_int] * 7)
    assert fire(17, 155914, 1, 3, 2, 7, 2, 1, 1) == 0
    assert got and got[0].event_type == 17 and got[0].fault_id == 155914 and got[0].switch_port == 7
    assert [e.fault_id for e in lq.fault_info()] == [155914]
    assert fire(17, 155914, 1, 3, 2, 7, 2, 0, 1) == 0
    assert lq.fault_info() == []


def test_unknown_event_type_is_counted_not_delivered(dcmi):
    got = []
    dcmi.subscribe(got.append)
    ctl(dcmi, "dcmitest_set_event_type", ctypes.c_int, restype=None)(7)
    fire = ctl(dcmi, "dcmitest_fire", ctypes.c_int, ctypes.c_uint, *[ctypes.c_int] * 4)
    assert fire(1, 0x80E18008, 1, 2, 0, 1) == 0
    assert got == [] and dcmi.unknown_events == 1
    ctl(dcmi, "dcmitest_set_event_type", ctypes.c_int, restype=None)(0)
    assert fire(1, 0x80E18008, 1, 2, 0, 1) == 0
    assert len(got) == 1


def test_v2_family_by_dev_id(dcmi):
    v2 = api.DcmiV2(dcmi.lib)
    assert api.DcmiV2.supported(dcmi.lib)
    ctl(dcmi, "dcmitest_set_phy", ctypes.c_int, ctypes.c_int)(6, 30)
    v2.init()
    devs = v2.devices()
    assert [d.logic for d in devs] == list(range(8)) and devs[6] == api.DeviceIds(6, 30, 6, 0)
    codes = (ctypes.c_uint * 2)(0x81B18603, 0x020001002 & 0xFFFFFFFF)
    ctl(dcmi, "dcmitest_set_codes", ctypes.c_int, ctypes.c_void_p, ctypes.c_int)(6, codes, 1)
    assert v2.error_codes(6) == [0x81B18603]
    ctl(dcmi, "dcmitest_set_rc", ctypes.c_char_p, ctypes.c_int, ctypes.c_int)(
        b"dcmi_get_device_health", 7, -8012
    )
    with pytest.raises(DeviceNotReady):
        v2.health(7)
    got = []
    done = threading.Event()
    v2.subscribe(lambda ev: (got.append(ev), done.set()))
    fire = ctl(dcmi, "dcmitest_fire", ctypes.c_int, ctypes.c_uint, *[ctypes.c_int] * 4)
    assert fire(2, 0x80E18008, 1, 3, 0, 1) == 0
    assert done.wait(5) and got[0].logic_id == 2 and got[0].severity == 3
