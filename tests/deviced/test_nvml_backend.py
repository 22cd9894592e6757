"""The nvml backend in-process over the NVML test double (issue 33): identity, XID events, each polled
condition from its readings, lost / back, events unsupported, refusals."""

from __future__ import annotations

import time

import pytest
from native.nvml_ctl import LIB_NAME, XID_EVENT, NvmlCtl, build_nvml

from deviced.nvml_table import NvidiaTable, xid_code
from deviced.state import OCCUR, ONCE
from faultmesh.dcmi.loader import DcmiError, NotSupported

pytest.importorskip("pynvml")
TABLE = NvidiaTable.load()
C = TABLE.conditions


@pytest.fixture
def rig(tmp_path, monkeypatch):
    try:
        lib = build_nvml()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    from deviced.nvml import NvmlBackend

    ctl = NvmlCtl.create(tmp_path / "nvml.ctl", ngpu=4)
    monkeypatch.setenv("FMNVML_CTL", str(ctl.path))
    b = NvmlBackend(TABLE, str(lib / LIB_NAME))
    b.init()
    yield ctl, b
    b.close(join_s=2.0)


def conds(b, i):
    return b.conditions(b.devices()[i])[0]


def test_identity_of_each_gpu(rig):
    _ctl, b = rig
    assert [d.logic for d in b.devices()] == [0, 1, 2, 3]
    info = b.info[3]
    assert info.uuid.startswith("GPU-") and info.serial and info.pci_bus_id == "00000000:1B:00.0"
    assert info.nvlinks == [0, 1, 2, 3] and b.chip_name(b.devices()[3]).startswith("NVIDIA H100")


def test_xid_events_carry_code_and_clear_kind(rig):
    ctl, b = rig
    got = []
    b.subscribe(got.append)
    assert b.events_armed == {0, 1, 2, 3}
    for gpu, xid in ((3, 79), (1, 13), (2, 70000), (0, 4242)):
        ctl.fire(gpu, XID_EVENT, xid)
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(e.logic_id, e.event_id, e.assertion) for e in got] == [
        (3, xid_code(79), OCCUR),  # a device XID: held until the GPU is reset
        (1, xid_code(13), ONCE),  # an application XID: a one-off notice
        (0, xid_code(4242), ONCE),  # unknown: the default (once), counted; 70000 is out of range
    ]
    assert b.unknown_xids == {70000: 1, 4242: 1}
    assert b.error_codes(b.devices()[3]) == [xid_code(79)]
    thread = b._thread
    b.close(join_s=2.0)
    assert not thread.is_alive()  # the event thread ends within one wait


def test_each_condition_from_its_reading(rig):
    ctl, b = rig
    g = ctl.gpu(2)
    assert conds(b, 2) == set()
    g.ecc[1][0] = 1  # uncorrected, volatile
    g.ecc[0][0] = 1001  # corrected above 1000
    g.retired_pending, g.remap_pending, g.remap_failure = 1, 1, 1
    g.nvlink_active_mask = 0b0111
    g.throttle = 0x20 | 0x8 | 0x80
    g.temp = 95
    g.nvlink_err[0] += 101
    g.pcie_replay += 101
    assert conds(b, 2) == {
        C[k]
        for k in ("ecc-dbe-volatile", "ecc-sbe-high", "retired-pages-pending", "remap-pending", "remap-failure",
                  "nvlink-down", "nvlink-errors", "pcie-replay", "thermal-slowdown", "hw-slowdown", "power-brake",
                  "temp-shutdown")
    }  # fmt: skip
    g.temp = 90
    assert C["temp-slowdown"] in conds(b, 2)  # and the counters did not move again: no rising errors
    assert C["pcie-replay"] not in conds(b, 2) and C["nvlink-errors"] not in conds(b, 2)


def test_lost_gpu_and_back_clears_reset_xids(rig):
    ctl, b = rig
    b.subscribe(lambda ev: None)
    ctl.fire(1, XID_EVENT, 48)
    deadline = time.monotonic() + 5
    while not b.latched.get(1) and time.monotonic() < deadline:
        time.sleep(0.01)
    ctl.gpu(1).lost = 1
    assert b.conditions(b.devices()[1]) == ({C["gpu-lost"]}, [])
    with pytest.raises(DcmiError):
        b.process_count(b.devices()[1])
    ctl.gpu(1).lost = 0
    assert b.conditions(b.devices()[1]) == (set(), [xid_code(48)])
    assert b.error_codes(b.devices()[1]) == []


def test_events_unsupported_raise_so_deviced_polls(rig):
    ctl, b = rig
    for i in range(4):
        ctl.gpu(i).events_unsupported = 1
    with pytest.raises(NotSupported):
        b.subscribe(lambda ev: None)


def test_never_resets_a_gpu(rig):
    _ctl, b = rig
    with pytest.raises(NotSupported, match="does not reset"):
        b.reset(b.devices()[0])
