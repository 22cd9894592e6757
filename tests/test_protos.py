"""The committed stubs match the .proto sources, and the upstream services keep their wire names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from faultmesh._pb import config_pb2, fault_pb2, job_pb2, profiling_pb2, pubfault_pb2, recover_pb2

ROOT = Path(__file__).resolve().parent.parent


def test_generated_stubs_have_no_drift(tmp_path: Path) -> None:
    out = tmp_path / "_pb"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), str(out)], check=True, capture_output=True
    )
    committed = ROOT / "services" / "faultmesh" / "_pb"
    fresh = sorted(p.name for p in out.iterdir() if p.is_file())
    assert fresh == sorted(p.name for p in committed.iterdir() if p.is_file() and p.suffix in (".py", ".pyi"))
    for name in fresh:
        assert (out / name).read_text() == (committed / name).read_text(), f"{name} drifted: run make protos"


def test_upstream_full_method_names() -> None:
    names = {
        s.full_name
        for mod in (pubfault_pb2, recover_pb2, profiling_pb2, fault_pb2, job_pb2, config_pb2)
        for s in mod.DESCRIPTOR.services_by_name.values()
    }
    assert names == {"PubFault", "Recover", "TrainingDataTrace", "fault.Fault", "job.Job", "config.Config"}


def test_field_numbers_of_public_fault_request() -> None:
    fields = {f.name: f.number for f in pubfault_pb2.PublicFaultRequest.DESCRIPTOR.fields}
    assert fields == {"id": 1, "timestamp": 2, "version": 3, "resource": 4, "faults": 5}
    fault = {f.name: f.number for f in pubfault_pb2.Fault.DESCRIPTOR.fields}
    assert fault["influence"] == 7 and fault["faultLocation"] == 6 and fault["description"] == 8
