"""Operator CLI end to end: ``faultmesh trainsim`` as a process, ``switch-nic``, ``stress-test``, ``trace``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

from brain.brainkit import JOB, apply, npu_fault, wait_decision
from brain.procs import CLI, Background, run


async def run_cli(cd, *argv, timeout_s: float = 30.0) -> tuple[int, str, str]:
    return await run(
        [*CLI, *argv, "--grpc", f"127.0.0.1:{cd.grpc_port}", "--http", f"{cd.http.host}:{cd.http.port}"],
        timeout_s,
    )


class TrainsimProcess:
    """``faultmesh trainsim`` as a child process; its JSON lines are read from a file."""

    def __init__(self, cd, tmp_path, *flags: str) -> None:
        self.bg = Background(
            [*CLI, "trainsim", "--job-id", JOB, "--grpc", f"127.0.0.1:{cd.grpc_port}", *flags],
            tmp_path / f"trainsim-{len(flags)}-{'-'.join(flags)[:40]}.jsonl",
        )
        self.lines: list[dict] = []

    async def __aenter__(self):
        self.bg.start()
        await self.wait(lambda: any(e["event"] == "subscribed" for e in self.lines))
        await asyncio.sleep(0.1)
        return self

    async def wait(self, pred, timeout_s: float = 15.0):
        async with asyncio.timeout(timeout_s):
            while True:
                self.lines = self.bg.lines()
                if pred():
                    return
                if not self.bg.alive():
                    raise AssertionError(f"trainsim exited: {self.bg.out.read_text()[-2000:]}")
                await asyncio.sleep(0.05)

    def signals(self, kind=None):
        return [e for e in self.lines if e["event"] == "signal" and (kind is None or e["signalType"] == kind)]

    async def __aexit__(self, *exc):
        await asyncio.to_thread(self.bg.stop)


async def test_trainsim_process_answers_a_hardware_fault(cd, tmp_path):
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path) as sim:
        await cd.center.upsert(npu_fault())
        await wait_decision(cd, "recover-success", timeout_s=15)
        await sim.wait(lambda: len(sim.signals()) >= 4)  # its stdout may lag the decision
        assert [s["signalType"] for s in sim.signals()] == [
            "preExitProcess",
            "stopTrain",
            "globalFault",
            "changeStrategy",
        ]
        # clusterd decides on the report before its reply reaches the sim (and its stdout)
        await sim.wait(
            lambda: any(e["event"] == "reply" and e["rpc"] == "ReportRecoverStatus" for e in sim.lines)
        )
    rc, out, err = await run_cli(cd, "job", "recovery", JOB)
    assert rc == 0 and "recover-success" in out and "DECISION" in out


async def test_trainsim_refused_init_is_a_clear_error(cd):
    rc, out, err = await run_cli(cd, "trainsim", "--job-id", "no-such-job")
    assert rc == 4 and "Init: code 502" in err


@contextlib.asynccontextmanager
async def happy_then_failed(
    cd, tmp_path, happy: list[str], finish: str, fail_flags: list[str], failed: list[str]
):
    """An O&M command (``happy``) against a trainsim: exit 0 and ``finish`` printed; then ``failed``
    against a trainsim started with ``fail_flags``: exit 1. Yields that run's JSON outcome while
    the failing trainsim still runs."""
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path):
        rc, out, err = await run_cli(cd, *happy)
        assert rc == 0, err
        assert finish in out
    async with TrainsimProcess(cd, tmp_path, *fail_flags):
        rc, out, err = await run_cli(cd, *failed, "-o", "json")
        assert rc == 1, err
        yield json.loads(out)


async def test_cli_switch_nic_happy_and_failed(cd, tmp_path):
    async with happy_then_failed(
        cd, tmp_path, ["switch-nic", "--job-id", JOB, "--nic", "node-b:0=on", "--nic", "node-b:1=on"],
        "switch nic finish", ["--switch", "fail"], ["switch-nic", "--job-id", JOB, "--nic", "node-a:1=off"],
    ) as outcome:  # fmt: skip
        assert outcome["result"] == "switch nic failed, switch nic failed"
        await wait_decision(cd, "recover-success", timeout_s=15)


async def test_cli_switch_nic_bad_arguments(cd):
    await apply(cd)
    rc, out, err = await run_cli(cd, "switch-nic", "--job-id", JOB, "--nic", "node-b-0-on")
    assert rc == 2 and "expected NODE:DEVICE=on|off" in err
    rc, out, err = await run_cli(cd, "switch-nic", "--job-id", JOB, "--nic", "node-b:0=on")
    assert rc == 5 and "code 413" in err and "not registered" in err


async def test_cli_stress_test_happy_isolate_and_bad_ops(cd, tmp_path):
    async with happy_then_failed(
        cd, tmp_path, ["stress-test", "--job-id", JOB, "--ops", "aic,p2p", "--node", "node-a"],
        "stress test finish", ["--stress-rank-code", "3=2"], ["stress-test", "--job-id", JOB],
    ) as outcome:  # fmt: skip
        assert outcome["result"].startswith("stress test find fault, isolate node:['node-b'],result:{")
    rc, out, err = await run_cli(cd, "stress-test", "--job-id", JOB, "--ops", "aic,aic")
    assert rc == 2 and "repeats an op" in err
    rc, out, err = await run_cli(cd, "stress-test", "--job-id", JOB, "--ops", "hbm")
    assert rc == 2 and "unknown op" in err


async def test_cli_stress_test_suggests_the_jobs_node(cd, tmp_path):
    """issue 31: a typo'd --node is refused by clusterd in the reference's words; the CLI adds the
    job's node it meant (the did-you-mean of pubfault send and release)."""
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path):
        rc, out, err = await run_cli(cd, "stress-test", "--job", JOB, "--ops", "aic", "--node", "nod-a")
    assert rc == 4 and f"node:nod-a not exist in job:{JOB}" in err, err
    assert "node 'nod-a' is not one of the job's (did you mean 'node-a'" in err, err


async def test_cli_trace_on_off_get(cd, tmp_path):
    await apply(cd)
    rc, out, err = await run_cli(cd, "trace", "on", "default/llama", "--light")
    assert rc == 0, err
    assert out.split("\n")[1].split() == ["default/llama", "off", "on", "on", "on", "on"]
    rc, out, err = await run_cli(cd, "trace", "get", "default/llama", "-o", "json")
    assert json.loads(out)["CommunicationOperator"] == "off" and json.loads(out)["Step"] == "on"
    rc, out, err = await run_cli(cd, "trace", "off", "default/llama")
    assert rc == 0 and out.split("\n")[1].split()[1:] == ["off"] * 5
    rc, out, err = await run_cli(cd, "trace", "on", "llama")
    assert rc == 2 and "is not NAMESPACE/JOB" in err
    rc, out, err = await run_cli(cd, "trace", "on", "default/nope")
    assert rc == 4 and "notify subscribe failed" in err  # an unknown job: not found
    rc, out, err = await run_cli(cd, "trace", "get", "default/never-set")
    assert rc == 4 and "failed to found configmap" in err
    rc, out, err = await run_cli(cd, "trace", "on", "default/llama", "--set", "FP=maybe")
    assert rc == 2 and "--set 'FP=maybe'" in err


async def test_cli_bad_flags_and_unreachable(cd):
    rc, out, err = await run_cli(cd, "trainsim", "--job-id", JOB, "--status", "recover=abc")
    assert rc == 2 and "--status: code 'abc' must be an integer or silent" in err
    rc, out, err = await run_cli(cd, "trainsim", "--job-id", JOB, "--stress-rank-code", "x=9")
    assert rc == 2 and "is not rank=code" in err
    rc, out, err = await run([*CLI, "jobs", "--http", "127.0.0.1:1"], 30)
    assert rc == 3 and "cannot reach clusterd" in err
    rc, out, err = await run([*CLI, "stress-test", "--job-id", JOB, "--grpc", "127.0.0.1:1"], 30)
    assert rc == 3 and "StressTest: clusterd unreachable" in err


async def test_cli_jobs_reset_needs_the_token_and_clears_a_stuck_flow(tmp_path):
    """``faultmesh jobs reset JOB [--reevaluate]``: the operator undo through the authenticated API."""
    from brain.brainkit import FAST, Sims, decisions, expect_stop_train_dropped, stuck_at_stop_complete
    from support import make_clusterd

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    # a report timeout longer than the CLI runs take: the flow stays stuck until the reset
    cd = await make_clusterd(tmp_path, *FAST, "--report-timeout-s", "120", "--token-file", str(token))
    sims = Sims(f"127.0.0.1:{cd.grpc_port}", token="s3cret")
    try:
        await apply(cd)
        ctl = await stuck_at_stop_complete(cd, sims)
        rc, out, err = await run_cli(cd, "jobs", "reset", JOB)
        assert rc == 5 and "bearer token required" in err  # mutating: refused without the token
        assert ctl.state == "WaitReportStopComplete"
        rc, out, err = await run_cli(cd, "jobs", "reset", JOB, "--token-file", str(token), "-o", "json")
        assert rc == 0, err
        assert json.loads(out) == {
            "job_id": JOB,
            "result": "reset",
            "was": "WaitReportStopComplete",
            "state": "INIT",
        }
        assert not ctl.busy() and decisions(cd)[-1] == "operator-reset"
        pre_exits = decisions(cd).count("pre-exit")
        rc, out, err = await run_cli(
            cd, "job", "reset", "--job", JOB, "--reevaluate", "--token-file", str(token)
        )
        assert rc == 0 and out.split("\n")[1].split()[:2] == [JOB, "reset"], err
        async with asyncio.timeout(5):  # the still-active fault acts again as new
            while decisions(cd).count("pre-exit") <= pre_exits:
                await asyncio.sleep(0.02)
        await expect_stop_train_dropped(sims.running[-1][0])  # TaskD: see test_recovery_flows
        rc, out, err = await run_cli(cd, "jobs", "reset", "no-such-job", "--token-file", str(token))
        assert rc == 4 and "not found or not registered" in err
    finally:
        await sims.close()
        await cd.stop()


async def test_cli_stress_test_shows_progress_and_a_result_table(cd, tmp_path):
    """Off a terminal: plain progress lines on stderr; stdout: the outcome and one row per op."""
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path, "--stress-rank-code", "1=1"):
        rc, out, err = await run_cli(cd, "stress-test", "--job", JOB, "--ops", "aic,p2p", "--timeout-s", "60")
    assert rc == 1, err  # one op failed (code 1): the test failed, though training goes on
    assert f"stress-test {JOB}: waiting for the outcome (at most 60 s)" in err
    lines = out.splitlines()
    assert lines[0] == f"job {JOB}: stress test finish" and lines[1] == ""
    assert lines[2].split() == ["NODE", "DEVICE", "OP", "CODE", "MEANING", "DETAIL"]
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[3:]]
    assert [r[:4] for r in rows] == [
        [node, dev, op, "1" if (node, dev) == ("node-a", "1") else "0"]
        for node in ("node-a", "node-b")
        for dev in ("0", "1")
        for op in ("aic", "p2p")
    ]
    assert {r[4] for r in rows} == {"ok, no fault", "test failed; training can go on"}
    assert "{" not in out  # no raw JSON string in a cell


async def test_cli_switch_nic_result_table(cd, tmp_path):
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path):
        rc, out, err = await run_cli(
            cd, "switch-nic", "--job", JOB, "--nic", "node-b:0=on", "--nic", "node-b:1=off"
        )
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == f"job {JOB}: switch nic finish"
    assert [re.split(r"\s{2,}", line.strip()) for line in lines[2:]] == [
        ["NODE", "DEVICE", "SWITCH", "RESULT"],
        ["node-b", "0", "to the backup NIC", "done"],
        ["node-b", "1", "back to the primary NIC", "done"],
    ]
    assert f"switch-nic {JOB}: waiting for the outcome" in err


def _run_with_tty_stderr(argv: list[str], timeout_s: float = 60.0) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal (as in an operator's shell); stdout is a pipe."""
    import os
    import pty
    import select
    import subprocess

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    tty = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            tty += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(10), out, tty.decode(errors="replace")


async def test_cli_stress_test_spinner_on_a_terminal(cd, tmp_path):
    """On a terminal the wait is a live spinner with the elapsed time, gone once the outcome is in."""
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path, "--delay-s", "1"):
        argv = [*CLI, "stress-test", "--job", JOB, "--grpc", f"127.0.0.1:{cd.grpc_port}", "--timeout-s", "60"]
        rc, out, tty = await asyncio.to_thread(_run_with_tty_stderr, argv)
    assert rc == 0, tty
    assert f"stress-test {JOB}: waiting for the outcome (at most 60 s)" in tty
    assert re.search(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]", tty) and re.search(r"0:00:0\d", tty), tty  # spinner + elapsed
    assert "\x1b[" in tty and "still waiting" not in tty  # redrawn in place, not plain lines
    assert out.startswith(f"job {JOB}: stress test finish")
