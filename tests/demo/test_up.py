"""``faultmesh up``: the local stack comes up, answers, and Ctrl-C stops every process it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _marked(run_dir: Path) -> list[int]:
    mark = f"FAULTMESH_DEMO_RUN_DIR={run_dir}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def test_up_runs_until_ctrl_c(tmp_path):
    run_dir = tmp_path / "up"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "faultmesh",
            "up",
            "--run-dir",
            str(run_dir),
            "--servers",
            "2",
            "--bmc-poll",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 100
        for line in proc.stdout:
            lines.append(line)
            if "stack running" in line or time.monotonic() > deadline:
                break
        out = "".join(lines)
        assert "stack running; Ctrl-C stops every process" in out, out
        http = re.search(r"clusterd HTTP views : http://([0-9.:]+)/v1/faults", out).group(1)
        with urllib.request.urlopen(f"http://{http}/v1/nodes", timeout=5) as r:
            nodes = {n["name"]: n for n in json.loads(r.read())}
        assert sorted(nodes) == ["server-1", "server-2"]
        assert all({"noded", "deviced"} <= set(n["agents"]) for n in nodes.values())
        assert "faultmesh bmc-sim inject --control" in out  # the commands to try are printed
        assert len(_marked(run_dir)) == 1 + 2 * 3  # clusterd + 2 x (bmc-sim, noded, deviced)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, "".join(lines) + rest  # Ctrl-C is how `up` is meant to end
    assert "stopped 7 processes" in rest
    assert _marked(run_dir) == []
    assert (run_dir / "logs" / "clusterd.log").is_file()
