"""``faultmesh up`` keeps the stack running when one process crashes (issue 17): the crash is
reported, the process is started again after a backoff, and Ctrl-C still stops everything."""

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


def _pids(run_dir: Path, module: str) -> list[int]:
    mark = f"FAULTMESH_DEMO_RUN_DIR={run_dir}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0") and module.encode() in (
                    d / "cmdline"
                ).read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _read_until(proc, lines: list[str], text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if text in line or time.monotonic() > deadline:
            break
    out = "".join(lines)
    assert text in out, out
    return out


def _agents(http: str) -> set[str]:
    with urllib.request.urlopen(f"http://{http}/v1/nodes", timeout=5) as r:
        return set(json.loads(r.read())[0]["agents"])


def test_a_crashed_agent_is_restarted(tmp_path):
    run_dir = tmp_path / "up"
    proc = subprocess.Popen(
        [sys.executable, "-m", "faultmesh", "up", "--run-dir", str(run_dir), "--servers", "1",
         "--restart-initial-s", "0.5", "--supervise-s", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        out = _read_until(proc, lines, "stack running", 100)
        http = re.search(r"clusterd HTTP views : http://([0-9.:]+)/v1/faults", out).group(1)
        (old,) = _pids(run_dir, "noded")
        os.kill(old, signal.SIGKILL)  # an agent crash
        out = _read_until(proc, lines, "process restarted: noded-1", 30)
        assert re.search(r"process exited: noded-1 \(exit -9, .*noded-1.log\); restarting in 0\.5 s", out), (
            out
        )
        (new,) = _pids(run_dir, "noded")
        assert new != old
        deadline = time.monotonic() + 30
        while "noded" not in _agents(http):  # the new noded connects again
            assert time.monotonic() < deadline, "the restarted noded never reconnected"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, "".join(lines) + rest
    assert "stopped 4 processes" in rest  # clusterd, bmc-sim, noded (the restarted one), deviced
    assert _pids(run_dir, "noded") == []
