"""``faultmesh up``: the local stack comes up, answers, and Ctrl-C stops every process it started."""

from __future__ import annotations

import json
import re
import signal
import urllib.request

import pytest
from support import read_until, start_up, up_pids, up_stopped

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def test_up_runs_until_ctrl_c(tmp_path):
    run_dir = tmp_path / "up"
    proc = start_up(run_dir, "--servers", "2", "--bmc-poll", "1")
    lines: list[str] = []
    try:
        out = read_until(proc, lines, "stack running", 100)
        assert "stack running; Ctrl-C stops every process" in out, out
        http = re.search(r"clusterd HTTP views : http://([0-9.:]+)/v1/faults", out).group(1)
        with urllib.request.urlopen(f"http://{http}/v1/nodes", timeout=5) as r:
            nodes = {n["name"]: n for n in json.loads(r.read())}
        assert sorted(nodes) == ["server-1", "server-2"]
        assert all({"noded", "deviced"} <= set(n["agents"]) for n in nodes.values())
        assert "faultmesh bmc-sim inject --control" in out  # the commands to try are printed
        assert len(up_pids(run_dir)) == 1 + 2 * 3  # clusterd + 2 x (bmc-sim, noded, deviced)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=40)
    finally:
        up_stopped(proc)
    assert proc.returncode == 130, "".join(lines) + rest  # as `faultmesh demo` after Ctrl-C (tryout)
    assert "stopped 7 processes" in rest
    assert up_pids(run_dir) == []
    assert (run_dir / "logs" / "clusterd.log").is_file()
