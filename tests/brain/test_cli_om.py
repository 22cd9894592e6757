"""Operator CLI end to end: ``faultmesh trainsim`` as a process, ``switch-nic``, ``stress-test``, ``trace``."""

from __future__ import annotations

import asyncio
import json

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
        assert any(e["event"] == "reply" and e["rpc"] == "ReportRecoverStatus" for e in sim.lines)
    rc, out, err = await run_cli(cd, "job", "recovery", JOB)
    assert rc == 0 and "recover-success" in out and "DECISION" in out


async def test_trainsim_refused_init_is_a_clear_error(cd):
    rc, out, err = await run_cli(cd, "trainsim", "--job-id", "no-such-job")
    assert rc == 1 and "Init: code 502" in err


async def test_cli_switch_nic_happy_and_failed(cd, tmp_path):
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path):
        rc, out, err = await run_cli(
            cd, "switch-nic", "--job-id", JOB, "--nic", "node-b:0=on", "--nic", "node-b:1=on"
        )
        assert rc == 0, err
        assert "switch nic finish" in out
    async with TrainsimProcess(cd, tmp_path, "--switch", "fail"):
        rc, out, err = await run_cli(cd, "switch-nic", "--job-id", JOB, "--nic", "node-a:1=off", "-o", "json")
        assert rc == 1 and json.loads(out)["result"] == "switch nic failed, switch nic failed"
        await wait_decision(cd, "recover-success", timeout_s=15)


async def test_cli_switch_nic_bad_arguments(cd):
    await apply(cd)
    rc, out, err = await run_cli(cd, "switch-nic", "--job-id", JOB, "--nic", "node-b-0-on")
    assert rc == 2 and "expected NODE:DEVICE=on|off" in err
    rc, out, err = await run_cli(cd, "switch-nic", "--job-id", JOB, "--nic", "node-b:0=on")
    assert rc == 5 and "code 413" in err and "not registered" in err


async def test_cli_stress_test_happy_isolate_and_bad_ops(cd, tmp_path):
    await apply(cd)
    async with TrainsimProcess(cd, tmp_path):
        rc, out, err = await run_cli(
            cd, "stress-test", "--job-id", JOB, "--ops", "aic,p2p", "--node", "node-a"
        )
        assert rc == 0, err
        assert "stress test finish" in out
    async with TrainsimProcess(cd, tmp_path, "--stress-rank-code", "3=2"):
        rc, out, err = await run_cli(cd, "stress-test", "--job-id", JOB, "-o", "json")
        assert rc == 1 and json.loads(out)["result"].startswith(
            "stress test find fault, isolate node:['node-b'],result:{"
        )
    rc, out, err = await run_cli(cd, "stress-test", "--job-id", JOB, "--ops", "aic,aic")
    assert rc == 2 and "repeats an op" in err
    rc, out, err = await run_cli(cd, "stress-test", "--job-id", JOB, "--ops", "hbm")
    assert rc == 2 and "unknown op" in err


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
    assert rc == 1 and "notify subscribe failed" in err
    rc, out, err = await run_cli(cd, "trace", "get", "default/never-set")
    assert rc == 1 and "failed to found configmap" in err
    rc, out, err = await run_cli(cd, "trace", "on", "default/llama", "--set", "FP=maybe")
    assert rc == 2 and "--set 'FP=maybe'" in err


async def test_cli_bad_flags_and_unreachable(cd):
    rc, out, err = await run_cli(cd, "trainsim", "--job-id", JOB, "--status", "recover=abc")
    assert rc == 1 and "--status: code 'abc' must be an integer or silent" in err
    rc, out, err = await run_cli(cd, "trainsim", "--job-id", JOB, "--stress-rank-code", "x=9")
    assert rc == 1 and "is not rank=code" in err
    rc, out, err = await run([*CLI, "jobs", "--http", "127.0.0.1:1"], 30)
    assert rc == 3 and "cannot reach clusterd" in err
    rc, out, err = await run([*CLI, "stress-test", "--job-id", JOB, "--grpc", "127.0.0.1:1"], 30)
    assert rc == 3 and "StressTest: clusterd unreachable" in err
