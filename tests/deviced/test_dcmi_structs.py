"""Struct layouts of faultmesh.dcmi.structs against the C compiler, and the loader's typed errors."""

from __future__ import annotations

import ctypes

import pytest

from faultmesh.dcmi import loader, structs


@pytest.fixture
def ctl(native_libs):
    lib = ctypes.CDLL(str(native_libs.dcmi))
    lib.dcmitest_sizeof.argtypes = [ctypes.c_char_p]
    lib.dcmitest_offsetof.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    return lib


def test_dcmi_struct_sizes_match_c(ctl):
    for cname, cls in structs.CHECKED_STRUCTS.items():
        if cname.startswith(("Lq", "lq_")):
            continue
        assert ctl.dcmitest_sizeof(cname.encode()) == ctypes.sizeof(cls), cname
    assert ctypes.sizeof(structs.DcmiDmsFaultEvent) == 352
    assert ctypes.sizeof(structs.DcmiEvent) == 360


def test_dcmi_field_offsets_match_c(ctl):
    checked = 0
    for cname, cls in structs.CHECKED_STRUCTS.items():
        for fname, *_ in cls._fields_:
            off = ctl.dcmitest_offsetof(cname.encode(), fname.encode())
            if off >= 0:
                assert off == getattr(cls, fname).offset, f"{cname}.{fname}"
                checked += 1
    assert checked >= 25


def test_missing_library_raises_typed_error(tmp_path):
    with pytest.raises(loader.LibraryMissing) as ei:
        loader.load_dcmi(tmp_path / "nope.so")
    assert ei.value.rc == loader.RC_LIBRARY_MISSING
    assert "nope.so" in str(ei.value)


def test_missing_symbol_and_return_codes(native_libs):
    lib = loader.load_dcmi(native_libs.dcmi)
    assert loader.load_dcmi(native_libs.dcmi) is lib
    missing = lib.function("dcmi_no_such_call", ctypes.c_int)
    assert not missing.available
    with pytest.raises(loader.SymbolMissing):
        missing(0)
    set_rc = lib.symbol("dcmitest_set_rc", ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int)
    health = lib.function("dcmi_get_device_health", ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint))
    out = ctypes.c_uint(7)
    try:
        set_rc(b"dcmi_get_device_health", 3, loader.RC_DEVICE_NOT_READY)
        with pytest.raises(loader.DeviceNotReady) as ei:
            health(0, 3, ctypes.byref(out))
        assert ei.value.rc == -8012 and ei.value.func == "dcmi_get_device_health"
        set_rc(b"dcmi_get_device_health", 3, loader.RC_NOT_SUPPORTED)
        with pytest.raises(loader.NotSupported):
            health(0, 3, ctypes.byref(out))
        set_rc(b"dcmi_get_device_health", 3, -1)
        with pytest.raises(loader.DcmiError) as ei:
            health(0, 3, ctypes.byref(out))
        assert type(ei.value) is loader.DcmiError
        health(0, 2, ctypes.byref(out))
        assert out.value == 0
    finally:
        set_rc(b"dcmi_get_device_health", 3, 0)


def test_lingqu_struct_layouts_match_c(native_libs):
    lq = ctypes.CDLL(str(native_libs.lingqu))
    lq.lqtest_sizeof.argtypes = [ctypes.c_char_p]
    lq.lqtest_offsetof.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    assert lq.lqtest_sizeof(b"LqDcmiEvent") == ctypes.sizeof(structs.LqDcmiEvent) == 112
    assert lq.lqtest_sizeof(b"lq_dcmi_event_filter") == ctypes.sizeof(structs.LqDcmiEventFilter)
    checked = 0
    for cname in ("LqDcmiEvent", "lq_dcmi_event_filter"):
        cls = structs.CHECKED_STRUCTS[cname]
        for fname, *_ in cls._fields_:
            off = lq.lqtest_offsetof(cname.encode(), fname.encode())
            if off >= 0:
                assert off == getattr(cls, fname).offset, f"{cname}.{fname}"
                checked += 1
    assert checked == 11
