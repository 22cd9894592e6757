"""DPC / DTFS storage monitors (reference noded.md §5): parsing, hysteresis with an injected clock,
file safety, codes and levels vs ClusterD's public fault table."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from noded_support import source_ctx
from prometheus_client import CollectorRegistry

from noded.metrics import NodedMetrics
from noded.sources import storage
from noded.sources.storage import Dpc, DpcEvaluator, Dtfs, StatusFileError


def dpc_text(*insts):
    return "".join(f"[instidx={i}]\nDPC_INTERNAL_ERROR: {m}\nDPC_PROCESS_ERROR: {p}\n" for i, m, p in insts)


def dtfs_text(*insts):
    return "".join(f"[instidx={i}]\nDTFS_PROCESS_ERROR: {p}\nDTFS_LINK_ERROR: {lk}\n" for i, p, lk in insts)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_levels_match_clusterd_public_fault_table(fault_tables):
    cfg = json.loads((fault_tables / "publicFaultConfiguration.json").read_text())
    levels = {c: key.removesuffix("Codes") for key, codes in cfg["publicFaultCode"].items() for c in codes}
    for code, level in storage.STORAGE_LEVELS.items():
        assert levels[code] == level, code


def test_parse_dpc_blocks():
    st = storage.parse_status(
        dpc_text((0, 0, 0), (1, -12, -1)), ("DPC_INTERNAL_ERROR", "DPC_PROCESS_ERROR"), ({0, -12}, {0, -1})
    )
    assert st == {0: (0, 0), 1: (-12, -1)}


@pytest.mark.parametrize(
    "text",
    [
        "[instidx=0]\nDPC_INTERNAL_ERROR: 0\n",  # incomplete block
        "[instidx=x]\nDPC_INTERNAL_ERROR: 0\nDPC_PROCESS_ERROR: 0\n",
        "[instidx=0]\nDPC_PROCESS_ERROR: 0\nDPC_INTERNAL_ERROR: 0\n",  # wrong order
        "[instidx=0]\nDPC_INTERNAL_ERROR: 5\nDPC_PROCESS_ERROR: 0\n",  # unknown value
        "[instidx=0]\nDPC_INTERNAL_ERROR: 0\nDPC_PROCESS_ERROR: -12\n",
    ],
)
def test_bad_dpc_text_rejected(text):
    with pytest.raises(StatusFileError):
        storage.parse_status(text, ("DPC_INTERNAL_ERROR", "DPC_PROCESS_ERROR"), ({0, -12}, {0, -1}))


def test_dpc_memory_hysteresis_ten_minutes():
    clock = Clock()
    ev = DpcEvaluator(clock)
    assert ev.update({0: (0, 0), 1: (0, 0)}) == set()
    assert ev.update({0: (-12, 0), 1: (0, 0)}) == set()  # memory error starts
    clock.t += 599
    assert ev.update({0: (-12, 0), 1: (0, 0)}) == set()
    clock.t += 1
    assert ev.update({0: (-12, 0), 1: (0, 0)}) == {storage.DPC_MEMORY_CODE}  # held 10 min: on
    clock.t += 5
    assert ev.update({0: (0, 0), 1: (0, 0)}) == {storage.DPC_MEMORY_CODE}  # clear, but not for 10 min
    clock.t += 300
    assert ev.update({0: (0, 0), 1: (-12, 0)}) == {storage.DPC_MEMORY_CODE}  # another instance flaps
    clock.t += 5
    assert ev.update({0: (0, 0), 1: (0, 0)}) == {storage.DPC_MEMORY_CODE}
    clock.t += 599
    assert ev.update({0: (0, 0), 1: (0, 0)}) == {storage.DPC_MEMORY_CODE}
    clock.t += 1
    assert ev.update({0: (0, 0), 1: (0, 0)}) == set()  # every instance clear for 10 min: off


def test_dpc_memory_error_interrupted_restarts_the_hold():
    clock = Clock()
    ev = DpcEvaluator(clock)
    ev.update({0: (-12, 0)})
    clock.t += 400
    ev.update({0: (0, 0)})
    clock.t += 5
    ev.update({0: (-12, 0)})
    clock.t += 400
    assert ev.update({0: (-12, 0)}) == set()
    clock.t += 200
    assert ev.update({0: (-12, 0)}) == {storage.DPC_MEMORY_CODE}


def test_dpc_process_error_is_immediate():
    ev = DpcEvaluator(Clock())
    assert ev.update({0: (0, -1)}) == {storage.DPC_PROCESS_CODE}
    assert ev.update({0: (0, 0)}) == set()


def make_monitor(kind, path, clock=None):
    reg = CollectorRegistry()
    cls = {"dpc": Dpc, "dtfs": Dtfs}[kind]
    mon = cls(str(path), NodedMetrics(reg), clock=clock or Clock())
    mon.ctx = source_ctx(kind, "node-s", registry=reg)
    mon.reg = reg
    return mon


def write(path, text, mode=0o644):
    path.write_text(text)
    os.chmod(path, mode)


def node_faults(mon):
    return sorted((k.source, k.code, f.level) for k, f in mon.state.faults.items())


def test_dpc_monitor_reports_node_faults_with_reference_fault_id(tmp_path):
    f = tmp_path / "dpc_status_check"
    clock = Clock()
    write(f, dpc_text((0, 0, -1)))
    mon = make_monitor("dpc", f, clock)
    assert mon.check() is True
    assert node_faults(mon) == [("dpc", "110001020", "SubHealthFault")]
    fault = next(iter(mon.state.faults.values()))
    assert fault.device_type == "Node" and fault.device_id == -1
    assert fault.attributes["fault_id"] == hashlib.sha256(b"node-s/DPC_PROCESS").hexdigest()
    assert fault.attributes["resource"] == "dpcStorage"
    write(f, dpc_text((0, -12, 0)))
    assert mon.check() is True
    assert node_faults(mon) == []
    clock.t += 600
    assert mon.check() is True
    assert node_faults(mon) == [("dpc", "110001021", "SubHealthFault")]


def test_bad_file_keeps_state_and_counts(tmp_path):
    f = tmp_path / "dpc_status_check"
    write(f, dpc_text((0, 0, -1)))
    mon = make_monitor("dpc", f)
    mon.check()
    write(f, "garbage\n")
    assert mon.check() is False
    assert node_faults(mon) == [("dpc", "110001020", "SubHealthFault")]
    assert (
        mon.reg.get_sample_value(
            "faultmesh_noded_storage_reads_total", {"monitor": "dpc", "result": "format"}
        )
        == 1
    )
    f.unlink()
    assert mon.check() is False
    assert (
        mon.reg.get_sample_value(
            "faultmesh_noded_storage_reads_total", {"monitor": "dpc", "result": "missing"}
        )
        == 1
    )
    write(f, dpc_text((0, 0, 0)), mode=0o666)  # group/other writable: unsafe, like the reference
    assert mon.check() is False
    assert (
        mon.reg.get_sample_value(
            "faultmesh_noded_storage_reads_total", {"monitor": "dpc", "result": "unsafe"}
        )
        == 1
    )
    assert node_faults(mon) == [("dpc", "110001020", "SubHealthFault")]


def test_dtfs_monitor(tmp_path):
    f = tmp_path / "dtfs_status_check"
    write(f, dtfs_text((0, 0, 0), (1, 0, -1)))
    mon = make_monitor("dtfs", f)
    assert mon.check()
    assert node_faults(mon) == [("dtfs", "110001023", "PreSeparateNPU")]
    write(f, dtfs_text((0, -1, 0), (1, 0, 0)))
    assert mon.check()
    assert node_faults(mon) == [("dtfs", "110001022", "PreSeparateNPU")]
    write(f, "")
    assert mon.check() is False  # empty DTFS file is an error
    assert node_faults(mon) == [("dtfs", "110001022", "PreSeparateNPU")]
    write(f, dtfs_text((0, 0, 0)))
    assert mon.check()
    assert node_faults(mon) == []
