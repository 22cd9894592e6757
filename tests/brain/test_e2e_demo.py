"""The demo path against a real clusterd process: job apply, trainsim as a process, a stress test and
a NIC switch through the CLI, then a RestartNPU fault from a deviced agent -> a queryable recovery."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import yaml
from brain.brainkit import FAST, JOB, job_spec
from brain.procs import CLI, Background

from faultmesh.agent import AgentClient
from faultmesh.model import Fault


def cli(proc, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *argv, "--http", proc.http, "--grpc", proc.grpc], capture_output=True, text=True, timeout=60
    )


async def test_demo_end_to_end(clusterd_process, tmp_path):
    proc = clusterd_process(*FAST)
    jf = Path(__file__).with_name("data") / "demo-job.yaml"
    assert yaml.safe_load(jf.read_text()) == {**job_spec(), "process-recover-enable": "on"}
    r = await asyncio.to_thread(cli, proc, "job", "apply", "-f", str(jf))
    assert r.returncode == 0, r.stderr
    sim = Background(
        [*CLI, "trainsim", "--job-id", JOB, "--grpc", proc.grpc], tmp_path / "trainsim.jsonl"
    ).start()
    try:
        deadline = time.monotonic() + 20
        while not proc.get_json(f"/v1/jobs/{JOB}/recovery")["subscribed"]:
            assert time.monotonic() < deadline and sim.alive(), sim.out.read_text()
            await asyncio.sleep(0.1)
        r = await asyncio.to_thread(cli, proc, "stress-test", "--job-id", JOB, "--ops", "aic,p2p")
        assert r.returncode == 0 and "stress test finish" in r.stdout, r.stdout + r.stderr
        r = await asyncio.to_thread(cli, proc, "switch-nic", "--job-id", JOB, "--nic", "node-a:0=on")
        assert r.returncode == 0 and "switch nic finish" in r.stdout, r.stdout + r.stderr
        agent = AgentClient(proc.grpc, "node-b", "deviced")
        agent.state.upsert(Fault("deviced", "node-b", "NPU", 1, "80E18402", "RestartNPU"))
        await agent.start()
        try:
            await agent.wait_synced()
            deadline = time.monotonic() + 20
            while True:
                rec = proc.get_json(f"/v1/jobs/{JOB}/recovery")
                if "recover-success" in [d["decision"] for d in rec["decisions"]]:
                    break
                assert time.monotonic() < deadline, rec
                await asyncio.sleep(0.1)
        finally:
            await agent.stop()
        decided = [(d["flow"], d["decision"]) for d in rec["decisions"]]
        assert decided[-3:] == [
            ("recovery", "stop-train"),
            ("recovery", "recover"),
            ("recovery", "recover-success"),
        ]
        assert (
            rec["decisions"][-3]["faults"][0]["rank"] == 3
            and rec["decisions"][-3]["faults"][0]["code"] == "80E18402"
        )
        r = await asyncio.to_thread(cli, proc, "jobs")
        assert "UnHealthy" in r.stdout  # the fault is still there (recovery does not clear hardware)
        assert "recovery decision" in proc.log_text() and "decision=recover-success" in proc.log_text()
    finally:
        await asyncio.to_thread(sim.stop)
