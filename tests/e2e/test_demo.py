"""``make demo`` as an end-to-end test (issue 9): the same scenario, with shorter intervals set by flags.

The demo starts clusterd, 4 x (bmc-sim, noded, deviced sim) with pingmesh on a 4 x 16-NPU super pod and
one simulated NVIDIA GPU server (deviced sim with the NVIDIA table),
a real 4-rank PyTorch CPU job and ``faultmesh trainsim``; injects every fault of the scenario and
exits 0 only when each one was detected and localized right. This test checks what a user sees:
the exit status, every summary row RIGHT, the log folder named at the end, and that no process the
demo started is left running — after a normal run and after a Ctrl-C.

Timing-sensitive (a real training job): not on parallel runners (torch-real-input.md §6).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the faultmesh[torch] extra (torch==2.13.0)")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.serial,  # `make test` runs it alone after the parallel part
    pytest.mark.skipif(
        bool(os.environ.get("PYTEST_XDIST_WORKER")),
        reason="timing test: must not share the 2 cores with parallel test workers",
    ),
]

# Shorter intervals than `make demo` (whose defaults are the real rules): the same scenario.
CI_FLAGS = [
    "--bmc-poll", "1",
    "--link-recover", "10",
    "--pingmesh-period", "5",
    "--slownode-round", "0.5",
    "--slow-after-steps", "40",
    "--detect-timeout", "20",
]  # fmt: skip

EXPECTED_ROWS = [
    "iBMC alarm 0800004B (PCIe card), server-2 PCIe Card 3",
    "NPU fault 80E18008 (RestartNPU), server-1 NPU 0",
    "GPU XID 79 (SeparateNPU), gpu-server-1 GPU 3",
    "NPU link down 81078603, server-3 NPU 4",
    "link still down after 20 s (escalation)",
    "link up again after 25 s (recovery)",
    "public fault 020001001 via CLI, server-4 NPU 5",
    "lossy HCCS link server-2 NPU 1 <-> NPU 6 (30% loss)",
    "online stress test (AIC, P2P) on server-4, job ranks 2,3",
    "NIC switch of server-4 NPU 0,1 (ranks 2,3)",
    "rank 2 slowed by 40% (sleep), server-4",
]


def _demo(run_dir: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fmtools.demo", "--run-dir", str(run_dir), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _left_over(run_dir: Path) -> list[str]:
    """Processes of this demo run: every process the demo starts (and what those start, such as the
    PyTorch ranks) carries ``FAULTMESH_DEMO_RUN_DIR=<run dir>`` in its environment."""
    mark = f"FAULTMESH_DEMO_RUN_DIR={run_dir}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if mark not in (d / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(f"{d.name}: {cmd[:200]}")
    return out


def _finish(proc: subprocess.Popen, timeout_s: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the demo stops its children itself
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(f"the demo did not finish in {timeout_s:.0f} s:\n{out[-6000:]}") from None
    return out


def _summary_rows(out: str) -> list[tuple[str, str]]:
    """(fault, result) per summary row."""
    block = out.split("\nSUMMARY\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    rows = []
    for line in block:
        m = re.match(r"^\d+\s+(.+?)\s{2,}.*\s(RIGHT|WRONG|MISSING|NOT AVAILABLE)$", line)
        assert m, f"summary line not understood: {line!r}"
        rows.append((m.group(1).strip(), m.group(2)))
    return rows


@pytest.mark.timeout(300)
def test_demo_detects_every_fault(tmp_path):
    run_dir = tmp_path / "demo"
    t0 = time.monotonic()
    out = _finish(_demo(run_dir, *CI_FLAGS), 270)
    took = time.monotonic() - t0
    print(out[-4000:])
    assert "SUMMARY" in out, out[-6000:]
    rows = _summary_rows(out)
    assert [r[0] for r in rows] == EXPECTED_ROWS, rows
    assert [r for r in rows if r[1] != "RIGHT"] == [], out[-6000:]
    assert "every injected fault was detected and localized right (exit 0)" in out
    # where to look: the log folder is named, and every process logged there
    assert re.search(rf"logs folder\s+: {re.escape(str(run_dir / 'logs'))} ", out), out[-2000:]
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert "SUMMARY" in (run_dir / "logs" / "demo.log").read_text()  # the demo's own lines too
    for name in ["clusterd", "train", "trainsim"] + [
        f"{k}-{i}" for k in ("bmc-sim", "noded", "deviced") for i in range(1, 5)
    ]:
        assert f"{name}.log" in logs, sorted(logs)
    assert "got degradation, slow rank ids: [2]" in (run_dir / "logs" / "clusterd.log").read_text()
    assert _left_over(run_dir) == []
    print(f"demo took {took:.0f} s")


@pytest.mark.timeout(120)
def test_ctrl_c_stops_every_process(tmp_path):
    run_dir = tmp_path / "demo-int"
    proc = _demo(run_dir, *CI_FLAGS)
    lines = []
    deadline = time.monotonic() + 90
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "all connected to clusterd" in line or time.monotonic() > deadline:
            break
    assert any("all connected to clusterd" in ln for ln in lines), "".join(lines)
    assert len(_left_over(run_dir)) >= 13  # clusterd + 4 x (bmc-sim, noded, deviced) at least
    proc.send_signal(signal.SIGINT)
    out = "".join(lines) + _finish(proc, 60)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted: stopping every process" in out
    assert _left_over(run_dir) == [], out[-3000:]
