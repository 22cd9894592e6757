"""Contract: every entry of noded's SOURCES tuple, against its simulator, through noded's own wiring
(flags -> its config section -> ``from_config`` -> ``start_sources`` with a SourceContext): start,
raise a fault, see it, recover, see it recover, stop within the budget leaving no task behind.

- bmc: ``faultmesh bmc-sim`` (an iBMC OEM alarm added and cleared);
- dpc / dtfs: a status file (an instance's process / link error set and cleared);
- pingmesh: the HCCS fabric simulator file (a link made fully lossy, then cleared): result rows;
- slownode: a profiling data folder written by a synthetic 4-rank job (rank 2 stalls, then heals):
  node results with ``isSlow``.

Source: issue 12 "Guards" (a contract test per source x its simulator).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import orjson
import pytest
from noded_support import BmcSim
from prometheus_client import CollectorRegistry
from slownode_support import SyntheticJob

from faultmesh import config
from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentState
from faultmesh.runtime import BlockingPool
from faultmesh.source import SourceContext, SourceMetrics, start_sources, stop_sources
from fdol.slownet import pinglist
from fmtools.sims import fabric as fab
from noded import sources
from noded.app import build_parser
from noded.metrics import NodedMetrics

NODE = "node-0"
STOP_BUDGET_S = 3.0


async def until(pred, what: str, timeout_s: float = 20.0):
    """Await ``pred()`` truthy (polled every 0.05 s); returns it. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Run:
    """One source started the way noded starts it; ``state`` is what it reported."""

    def __init__(self, cls: type, argv: list[str]) -> None:
        args = config.parse(build_parser(), ["--node-name", NODE, *argv])
        self.registry = CollectorRegistry()
        self.section = sources.config_section(args, cls)
        self.src = cls.from_config(self.section, NodedMetrics(self.registry))
        self.state = AgentState(NODE)
        self.pool = BlockingPool(2, f"contract-{cls.name}")
        self.ctx = SourceContext(
            name=cls.name,
            node=NODE,
            state=self.state,
            pool=self.pool,
            config=self.section,
            registry=self.registry,
            metrics=SourceMetrics(self.registry),
            node_ip=args.node_ip or "",
        )
        self.started: list = []

    async def start(self) -> None:
        self.started = await start_sources([self.src], lambda s: self.ctx)
        assert [s for s, _ in self.started] == [self.src], "the source did not start"

    async def control(self, **body) -> None:
        msg = agent_pb2.ControlMessage(seq=1, **body)
        await self.ctx.controls[msg.WhichOneof("body")](msg)

    def faults(self, source: str) -> list[tuple[str, int, str]]:
        return sorted((k.device_type, k.device_id, k.code) for k in self.state.faults if k.source == source)

    async def stop(self) -> None:
        t0 = time.monotonic()
        await stop_sources(self.started, STOP_BUDGET_S)
        took = time.monotonic() - t0
        self.pool.shutdown()
        assert took < STOP_BUDGET_S + 0.5, f"stop took {took:.2f} s"
        assert len(self.ctx.tasks) == 0, "tasks left behind"


# -- one scenario per source -----------------------------------------------------------------------
async def bmc(tmp_path: Path) -> None:
    sim = BmcSim(tmp_path).start()
    try:
        run = Run(
            sources.Bmc,
            ["--bmc-host", "127.0.0.1", "--bmc-port", str(sim.port), "--bmc-password-file",
             str(sim.password_file), "--poll-interval", "1", "--bmc-timeout", "3"],
        )  # fmt: skip
        await run.start()
        try:
            await until(lambda: run.src.polls_ok >= 1, "the first BMC poll", 10)
            assert run.faults("bmc-oem") == [] and run.state.node_status == "Healthy"
            sim.add_alarm("0800004B", "Memory", 3)
            await until(lambda: run.faults("bmc-oem") == [("Memory", 3, "0800004B")], "the OEM alarm")
            assert run.state.node_status == "PreSeparate"
            sim.clear_alarms()
            await until(lambda: run.faults("bmc-oem") == [], "the alarm to recover")
            assert run.state.node_status == "Healthy"
        finally:
            await run.stop()
    finally:
        sim.stop()


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o644)


async def _storage(tmp_path: Path, cls: type, keys: tuple[str, str], bad: tuple[int, int], code: str):
    kind = cls.name
    f = tmp_path / f"{kind}_status_check"

    def block(a: int, b: int) -> str:
        return f"[instidx=0]\n{keys[0]}: {a}\n{keys[1]}: {b}\n"

    _write(f, block(0, 0))
    run = Run(cls, [f"--{kind}-status-file", str(f), "--storage-interval", "0.1"])
    await run.start()
    try:
        await until(lambda: run.src.polls_ok >= 1, f"the first {kind} read", 5)
        assert run.faults(kind) == []
        _write(f, block(*bad))
        await until(lambda: run.faults(kind) == [("Node", -1, code)], f"the {kind} fault")
        _write(f, block(0, 0))
        await until(lambda: run.faults(kind) == [], f"the {kind} fault to recover")
        assert run.registry.get_sample_value("faultmesh_source_up", {"source": kind}) == 1
    finally:
        await run.stop()


async def dpc(tmp_path: Path) -> None:
    await _storage(tmp_path, sources.Dpc, ("DPC_INTERNAL_ERROR", "DPC_PROCESS_ERROR"), (0, -1), "110001020")


async def dtfs(tmp_path: Path) -> None:
    await _storage(tmp_path, sources.Dtfs, ("DTFS_PROCESS_ERROR", "DTFS_LINK_ERROR"), (0, -1), "110001023")


async def pingmesh(tmp_path: Path) -> None:
    nodes = [NODE, "node-1"]
    fabric = tmp_path / "fabric.json"
    fab.write_fabric_file(fabric, {"nodes": nodes, "npus_per_node": 4, "seed": 2, "faults": []})
    sp = fab.Fabric.from_file(fabric).sp
    pairs = pinglist.by_node(pinglist.generate(sp))
    (tmp_path / "cfg.yaml").write_text('global: {"activate": "on", "task_interval": 1}\n')
    (tmp_path / "topo.json").write_text(json.dumps(sp.to_json_obj()))
    server_index = sp.nodes[NODE].server_index
    lists = tmp_path / "pm" / "cluster" / f"super-pod-{sp.super_pod_id}"
    lists.mkdir(parents=True)
    (lists / f"ping_list_{server_index}.json").write_text(json.dumps(pinglist.to_reference_json(pairs[NODE])))
    run = Run(
        sources.Pingmesh,
        ["--pingmesh-backend", "sim", "--pingmesh-fabric", str(fabric), "--pingmesh-dir", str(tmp_path / "pm"),
         "--pingmesh-config-file", str(tmp_path / "cfg.yaml"), "--pingmesh-topology-file",
         str(tmp_path / "topo.json"), "--pingmesh-collect-interval-s", "0.2", "--pingmesh-file-poll-s", "0.1"],
    )  # fmt: skip
    src_addr, dst_addr = str(sp.nodes[NODE].devices[0]), str(sp.nodes["node-1"].devices[0])

    def loss_after(n: int) -> list[float]:
        rows = list(run.state.ping_results)[n:]
        return [r.avg_loss_rate for r in rows if (r.src_addr, r.dst_addr) == (src_addr, dst_addr)]

    await run.start()
    try:
        await until(lambda: loss_after(0), "the first result rows")
        assert set(loss_after(0)) == {0.0}
        fab.main(
            ["inject", str(fabric), "lossy_link", "--a", f"{NODE}/0", "--b", "node-1/0", "--loss", "1.0"]
        )
        n = len(run.state.ping_results)
        await until(lambda: 1.0 in loss_after(n), "the lossy link in the rows")
        fab.main(["clear", str(fabric)])
        await until(lambda: loss_after(len(run.state.ping_results) - 64)[-1:] == [0.0], "the link to recover")
    finally:
        await run.stop()


async def slownode(tmp_path: Path) -> None:
    prof = tmp_path / "profiling"
    prof.mkdir()
    node_ip = "10.0.0.5"  # FD-OL names the node by its IP (the flag, as the chart passes it)
    run = Run(sources.SlowNode, ["--profiling-dir", str(prof), "--node-ip", node_ip])
    featconf = {
        "jobName": "job1", "jobNamespace": "default", "jobId": "job1", "normalNumber": 20, "nSigma": 3,
        "degradationPercentage": 0.3, "nConsecAnomaliesSignifySlow": 3, "nSecondsDoOneDetection": 0.3,
        "clusterMeanDistance": 1.3, "cardOneNode": 16, "SlowNode": 1, "patternWindowSteps": 20,
    }  # fmt: skip

    def results() -> list[dict]:
        return [orjson.loads(r.result_json)["slownode_job1"][node_ip] for r in run.state.slownode_reports]

    await run.start()
    job = SyntheticJob(prof, "job1", steps=4000, pace_s=0.01, slow_rank=2, slow_from=60)
    try:
        sw = agent_pb2.SlowNodeJob(
            job_id="job1", enable=True, ranks=[2, 3], featconf_json=orjson.dumps(featconf)
        )
        await run.control(slownode_job=sw)
        assert list(run.src.jobs) == ["job1"]
        job.start()
        await until(lambda: any(r["isSlow"] == 1 for r in results()), "a slow node result", 30)
        slow = next(r for r in results() if r["isSlow"] == 1)
        assert slow["slowCalculateRanks"] == [2]
        job.heal.set()
        n = len(results())
        await until(lambda: any(r["isSlow"] == 0 for r in results()[n:]), "a clean result after healing", 30)
        await run.control(slownode_job=agent_pb2.SlowNodeJob(job_id="job1", enable=False))
        assert run.src.jobs == {}
    finally:
        job.stop_event.set()
        await asyncio.to_thread(job.join, 10)
        await run.stop()


SCENARIOS = {"bmc": bmc, "dpc": dpc, "dtfs": dtfs, "pingmesh": pingmesh, "slownode": slownode}


def test_every_source_has_a_contract_scenario():
    assert [c.name for c in sources.SOURCES] == list(SCENARIOS)


@pytest.mark.parametrize("name", [c.name for c in sources.SOURCES])
async def test_source_start_raise_recover_stop(name, tmp_path):
    await SCENARIOS[name](tmp_path)
