"""A mixed fleet (issue 33): ``faultmesh up --servers 1 --gpu-servers 1`` runs an NPU server and a
simulated NVIDIA GPU server against one clusterd; a fault on each shows in the one cluster view, the
GPU's at the NVIDIA table's level, and the TRY list names the GPU commands."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from support import read_until, start_up, up_pids, up_stopped, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def device_sim(addr: str, *args: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "faultmesh", "device-sim", "--sim", addr, *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_up_with_a_gpu_server_shows_faults_of_both_vendors(tmp_path):
    run_dir = tmp_path / "up"
    proc = start_up(run_dir, "--servers", "1", "--gpu-servers", "1", "--bmc-poll", "1")
    lines: list[str] = []
    try:
        out = read_until(proc, lines, "stack running", 100)
        assert "1 GPU servers (deviced, 8 simulated NVIDIA GPUs each)" in out
        http = re.search(r"clusterd HTTP views : http://([0-9.:]+)/v1/faults", out).group(1)
        gpu_sim = re.search(r"device-sim --sim ([0-9.:]+) fault 3 4E560000004F", out).group(1)
        npu_sim = re.search(r"device-sim --sim ([0-9.:]+) fault 0 80E18008", out).group(1)
        assert gpu_sim != npu_sim and "faultmesh explain xid 79" in out

        def get(path: str):
            with urllib.request.urlopen(f"http://{http}{path}", timeout=5) as r:
                return json.loads(r.read())

        nodes = {n["name"]: n for n in get("/v1/nodes")}
        assert sorted(nodes) == ["gpu-server-1", "server-1"]
        device_sim(gpu_sim, "fault", "3", "4E560000004F")  # XID 79 on GPU 3
        device_sim(npu_sim, "fault", "0", "80E18008")

        def both():
            got = {(f["node"], f["device_id"], f["code"]): f["level"] for f in get("/v1/faults")}
            return got if len(got) >= 2 else None

        seen = wait_for(both, "faults of both servers", 30)
        assert seen.get(("gpu-server-1", 3, "4E560000004F")) == "SeparateNPU", seen
        assert seen.get(("server-1", 0, "80E18008")) == "RestartNPU", seen
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=40)
    finally:
        up_stopped(proc)
    assert up_pids(run_dir) == []
