"""``faultmesh up --with-job`` (issue 17): the stack plus the example PyTorch job with slow-node
detection on; every TRY line it prints is a faultmesh command that works as printed (no curl), and
Ctrl-C leaves no process behind (the job's rank processes included)."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys

import pytest
from support import read_until, start_up, up_pids, up_stopped

pytestmark = [pytest.mark.slow, pytest.mark.timeout(280)]
pytest.importorskip("torch", reason="the example job needs faultmesh[torch]")


def _try_lines(out: str) -> list[str]:
    """The commands of the TRY block (comments cut)."""
    block = out.split("TRY (", 1)[1].split("\n", 1)[1]
    cmds = []
    for line in block.splitlines():
        if not line.startswith("  "):
            break
        cmds.append(line.split("#", 1)[0].strip())
    return cmds


def _faultmesh(cmd: str, timeout_s: float = 90) -> subprocess.CompletedProcess:
    argv = shlex.split(cmd)
    assert argv[0] == "faultmesh", cmd
    return subprocess.run(
        [sys.executable, "-m", "faultmesh", *argv[1:]], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.parametrize(
    ("flags", "layout"),
    [
        (["--with-job"], "TP groups [0,1] [2,3]"),
        (["--with-job", "ddp"], "DistributedDataParallel, no TP group"),  # issue 34
    ],
)
def test_up_with_job_prints_cli_commands_that_work(tmp_path, flags, layout):
    run_dir = tmp_path / "up"
    proc = start_up(run_dir, "--servers", "2", "--bmc-poll", "1", *flags)
    lines: list[str] = []
    try:
        out = read_until(proc, lines, "stack running", 150)
        assert "stack running; Ctrl-C stops every process" in out, out
        assert f"JOB PyTorch job started: 4 gloo ranks on CPU, {layout}" in out, out
        assert "/v1/slownode/demo-job" in out and "/ui/job/demo-job" in out, out  # WHERE TO LOOK
        assert "demo-job registered with clusterd's Recover service" in out, out
        assert "not complete" not in out, out
        cmds = _try_lines(out)
        assert "curl" not in "\n".join(cmds), cmds
        assert any(c.startswith("touch ") and c.endswith("slow-rank") for c in cmds), cmds
        for cmd in (c for c in cmds if c.startswith("faultmesh ")):
            r = _faultmesh(cmd)
            assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
        # what a user reads back: the job, its detection switched on, the injected NPU fault
        r = _faultmesh(next(c for c in cmds if c.startswith("faultmesh jobs")))
        assert re.search(r"^default\s+demo-job\s+demo-job\s+running\s+4\s", r.stdout, re.M), r.stdout
        r = _faultmesh(next(c for c in cmds if c.startswith("faultmesh slownode status")) + " -o json")
        assert '"demo-job"' in r.stdout and r.returncode == 0, r.stdout
        r = _faultmesh(next(c for c in cmds if c.startswith("faultmesh faults")))
        assert "80E18008" in r.stdout, r.stdout
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        up_stopped(proc)
    assert proc.returncode == 130, "".join(lines) + rest  # Ctrl-C
    assert up_pids(run_dir) == []


def test_up_with_job_needs_two_servers():
    r = subprocess.run(
        [sys.executable, "-m", "faultmesh", "up", "--servers", "1", "--with-job"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--with-job places ranks on two servers" in r.stderr
