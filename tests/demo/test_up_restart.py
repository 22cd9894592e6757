"""``faultmesh up`` keeps the stack running when one process crashes (issue 17): the crash is
reported, the process is started again after a backoff, and Ctrl-C still stops everything."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request

import pytest
from support import read_until, start_up, up_pids, up_stopped, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _agents(http: str) -> set[str]:
    with urllib.request.urlopen(f"http://{http}/v1/nodes", timeout=5) as r:
        return set(json.loads(r.read())[0]["agents"])


def test_a_crashed_agent_is_restarted(tmp_path):
    run_dir = tmp_path / "up"
    proc = start_up(run_dir, "--servers", "1", "--restart-initial-s", "0.5", "--supervise-s", "0.2")
    lines: list[str] = []
    try:
        out = read_until(proc, lines, "stack running", 100)
        http = re.search(r"clusterd HTTP views : http://([0-9.:]+)/v1/faults", out).group(1)
        (old,) = up_pids(run_dir, "noded")
        os.kill(old, signal.SIGKILL)  # an agent crash
        out = read_until(proc, lines, "process restarted: noded-1", 30)
        assert re.search(r"process exited: noded-1 \(exit -9, .*noded-1.log\); restarting in 0\.5 s", out), (
            out
        )
        # the supervisor says "restarted" as it spawns: the new process may not have exec'd yet
        (new,) = wait_for(lambda: up_pids(run_dir, "noded"), "the restarted noded's process", 10)
        assert new != old
        deadline = time.monotonic() + 30
        while "noded" not in _agents(http):  # the new noded connects again
            assert time.monotonic() < deadline, "the restarted noded never reconnected"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=40)
    finally:
        up_stopped(proc)
    assert proc.returncode == 130, "".join(lines) + rest  # Ctrl-C
    assert "stopped 4 processes" in rest  # clusterd, bmc-sim, noded (the restarted one), deviced
    assert up_pids(run_dir, "noded") == []
