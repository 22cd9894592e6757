"""Wire compatibility: stubs generated here from protos written from the reference's field tables call
every service (Recover, TrainingDataTrace, PubFault, fault.Fault, job.Job, config.Config)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from brain.brainkit import MINDIE, apply, apply_specs, mindie_specs
from brain.procs import run

HERE = Path(__file__).resolve().parent


def compile_protos(out: Path) -> None:
    from grpc_tools import protoc

    sys.path.insert(0, str(HERE))
    try:
        from protos import ALL  # noqa: PLC0415 (the test's own proto texts)
    finally:
        sys.path.remove(str(HERE))
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    for name, text in ALL.items():
        (out / f"{name}.proto").write_text(text)
        rc = protoc.main(
            [
                "protoc",
                f"-I{out}",
                f"-I{include}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(out / f"{name}.proto"),
            ]
        )
        assert rc == 0, f"protoc failed on {name}"


@pytest.fixture
def gen(tmp_path) -> Path:
    out = tmp_path / "gen"
    out.mkdir()
    compile_protos(out)
    return out


async def test_every_service_with_independent_stubs(cd, gen):
    await apply(cd, id="wire-job-0001", name="wirejob")
    await apply_specs(cd, mindie_specs())
    rc, out, err = await run(
        [sys.executable, str(HERE / "client.py"), f"127.0.0.1:{cd.grpc_port}", "wire-job-0001", MINDIE],
        60,
        env={**os.environ, "PYTHONPATH": str(gen)},
        cwd=str(gen),
    )
    assert rc == 0, err[-3000:]
    o = json.loads(out)
    assert (o["init"], o["register"]) == (0, 0)
    assert o["health"] == "jobId=wire-job-0001, receive HeathCheck"
    assert o["process_fault"] == 0
    assert o["recovery"] == [
        ["stopTrain", ["stop_train"], [["2", "1"]], True],
        ["globalFault", ["on_global_rank", "fault_nodes_exit"], ["1"]],
        ["changeStrategy", "recover"],
    ]
    assert o["recover_status"] == 0
    assert o["switch_track"] == [0, "switching operation was successfully distributed"]
    assert o["switch_ranks"] == [["3"], [True], "wire-job-0001", "stopTrain", ["pause_train"]]
    assert o["switch_reply"] == 0
    assert o["switch_result"] == ["wire-job-0001", "switch nic finish", "continue"]
    assert o["stress_track"] == 0
    assert o["stress_params"] == {"0": [0, 1], "1": [0, 1]}
    assert o["stress_reply"] == 0
    assert o["stress_signals"] == ["pauseStartAgent", "continueStartAgent", "changeStrategy"]
    assert o["stress_result"].startswith("stress test finish, result:")
    assert o["trace_modify"] == [200, "successfully changed profiling marker enable status"]
    assert o["trace_get"] == [200, "on", "off"]
    assert o["trace_stream"] == [200, "update profiling switch", "on"]
    assert o["fault_register"] == 0
    assert o["pubfault"] == [0, "public fault send successfully"]
    assert o["fault_stream"] == [
        "wire-job-0001",
        "fault",
        "node-b",
        "SubHealthy",
        "0",
        "NPU",
        ["010001001"],
        "SubHealthy",
        ["SubHealthFault"],
    ]
    assert o["fault_get"] == [200, "all info returned", "wire-job-0001", 1]
    assert o["job_register"] == [200, 36]
    assert o["job_list"] == [5, "wire-job-0001", "wirejob", "default", "running", "2"]  # + 4 MindIE jobs
    assert o["config_register"] == 0
    assert o["config_table"] == [MINDIE, ["0", "1", "2"]]  # MindIE's global rank table
