"""noded pingmesh source against the fabric simulator: inputs, tasks, result files, rows."""

from __future__ import annotations

import argparse
import asyncio
import json
import types

import pytest

from clusterd.detectors import fdol_edge as edge
from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentState
from faultmesh.dcmi.hccsping import HccspingInfo
from faultmesh.runtime import BlockingPool
from faultmesh.source import SourceContext
from fdol.slownet import config as pmconfig
from fdol.slownet import pinglist
from fmtools.sims import fabric as fab
from noded.pingmesh import Pingmesh
from noded.pingmesh import results as res

NODES = ["node-0", "node-1"]


def make_app(tmp_path, node="node-0", **flags):
    p = argparse.ArgumentParser()
    Pingmesh.add_arguments(p)
    fabric_file = tmp_path / "fabric.json"
    if not fabric_file.exists():
        fab.write_fabric_file(fabric_file, {"nodes": NODES, "npus_per_node": 4, "seed": 2, "faults": []})
    argv = [
        "--pingmesh-backend",
        "sim",
        "--pingmesh-fabric",
        str(fabric_file),
        "--pingmesh-dir",
        str(tmp_path / "pm"),
    ]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    args = p.parse_args(argv)
    ctx = SourceContext("pingmesh", node, AgentState(node), BlockingPool(2), config=args)
    return types.SimpleNamespace(args=args, node_name=node, state=ctx.state, tasks=ctx.tasks, ctx=ctx)


def inputs(fabric_file):
    f = fab.Fabric.from_file(fabric_file)
    sp = f.sp
    pairs = pinglist.by_node(pinglist.generate(sp))
    cfg = pmconfig.parse_config({"global": '{"activate":"on","task_interval":1}'})
    return f, sp, pairs, cfg


def ctl(**body):
    return agent_pb2.ControlMessage(seq=1, **body)


async def started(tmp_path, **flags):
    app = make_app(tmp_path, **flags)
    comp = Pingmesh.from_config(app.args)
    await comp.start(app.ctx)
    return app, comp


async def test_pushed_inputs_start_tasks_and_rows_stream(tmp_path):
    app, comp = await started(tmp_path, pingmesh_collect_interval_s=3600)
    try:
        f, sp, pairs, cfg = inputs(tmp_path / "fabric.json")
        assert comp.super_pod_id == "0" and comp.server_index == 1 and sorted(comp.chips) == [0, 1, 2, 3]
        await comp.on_control(ctl(pingmesh_config=edge.config_to_pb(cfg)))
        await comp.on_control(ctl(topology=edge.topology_to_pb(sp)))
        await comp.on_control(
            ctl(ping_list=edge.ping_list_to_pb(pinglist.node_ping_list("0", pairs["node-0"])))
        )
        await comp._reconcile()
        # 4 chips x (task 0: 3 intra destinations, task 1: 1 inter destination)
        assert sorted(comp.plan) == [(p, t) for p in range(4) for t in (0, 1)]
        assert len(comp.plan[(0, 0)]) == 3 and comp.plan[(0, 1)] == (str(sp.nodes["node-1"].devices[0]),)
        uid = comp.plan_uid
        await comp._reconcile()  # unchanged inputs: same uid, nothing restarted
        assert comp.plan_uid == uid
        assert await comp.collect_once() == 16
        rows = list(app.state.ping_results)
        assert len(rows) == 16 and all(r.avg_loss_rate == 0 and r.super_pod_id == "0" for r in rows)
        assert {r.ping_task_id for r in rows} == {0, 1}
        # result files
        log = (tmp_path / "pm" / "node-0.log").read_text().splitlines()
        assert (
            log[0].startswith("[")
            and f'uid: {uid}, config: &types.HccspingMeshConfig{{Activate:"on", TaskInterval:1}}' in log[0]
        )
        assert "physicID: 0, taskID: 0, DestNum: 3" in log[1]
        first = json.loads(log[2].split(".py:0    ", 1)[1])
        assert (
            first["source_addr"] == "192.1.2.199"
            and first["suc_pkt_num"] == 10
            and first["fail_pkt_num"] == 0
        )
        csv = (tmp_path / "pm" / "cluster" / "super-pod-0" / "ping_result_1.csv").read_text().splitlines()
        assert csv[0] == res.CSV_HEADER and len(csv) == 17
        parts = csv[1].split(",")
        assert parts[8:11] == ["0.000"] * 3 and parts[1] == "0"
    finally:
        await comp.stop()
        await app.tasks.close()


async def test_invalid_inputs_rejected_and_previous_kept(tmp_path):
    app, comp = await started(tmp_path)
    try:
        f, sp, pairs, cfg = inputs(tmp_path / "fabric.json")
        await comp.on_control(ctl(pingmesh_config=edge.config_to_pb(cfg)))
        bad_cfg = agent_pb2.PingmeshConfig(
            activations={"global": agent_pb2.PingmeshActivation(activate=True, task_interval_s=99)}
        )
        with pytest.raises(ValueError, match="task_interval"):
            await comp.on_control(ctl(pingmesh_config=bad_cfg))
        assert comp.config == cfg
        other = agent_pb2.SuperPodTopology(
            super_pod_id="7",
            nodes=[agent_pb2.TopologyNode(node_name="node-0", server_index=1, phy_id_to_sdid={0: 1})],
        )
        with pytest.raises(ValueError, match="super pod 7"):
            await comp.on_control(ctl(topology=other))
        missing = agent_pb2.SuperPodTopology(
            super_pod_id="0",
            nodes=[agent_pb2.TopologyNode(node_name="node-9", server_index=5, phy_id_to_sdid={0: 1})],
        )
        with pytest.raises(ValueError, match="does not list node"):
            await comp.on_control(ctl(topology=missing))
        dup = agent_pb2.SuperPodTopology(super_pod_id="0", nodes=[
            agent_pb2.TopologyNode(node_name="node-0", server_index=1, phy_id_to_sdid={0: 5}),
            agent_pb2.TopologyNode(node_name="node-1", server_index=2, phy_id_to_sdid={0: 5})])  # fmt: skip
        with pytest.raises(ValueError, match="SDID 5"):
            await comp.on_control(ctl(topology=dup))
        assert comp.topology is None
        bad_list = agent_pb2.PingList(
            super_pod_id="0", tasks=[agent_pb2.PingTask(src_phy_id=0, dst_addrs=["1,2"])]
        )
        with pytest.raises(ValueError, match="bad destination"):
            await comp.on_control(ctl(ping_list=bad_list))
        assert comp.ping_list is None
    finally:
        await app.tasks.close()


async def test_file_inputs_and_loop_collects_and_restarts_after_chip_reset(tmp_path):
    fabric_file = tmp_path / "fabric.json"
    fab.write_fabric_file(fabric_file, {"nodes": NODES, "npus_per_node": 4, "seed": 2, "faults": []})
    f, sp, pairs, cfg = inputs(fabric_file)
    (tmp_path / "cfg.yaml").write_text('data:\n  global: \'{"activate":"on","task_interval":1}\'\n')
    (tmp_path / "topo.json").write_text(json.dumps(sp.to_json_obj()))
    list_dir = tmp_path / "pm" / "cluster" / "super-pod-0"
    list_dir.mkdir(parents=True)
    (list_dir / "ping_list_2.json").write_text(json.dumps(pinglist.to_reference_json(pairs["node-1"])))
    app, comp = await started(
        tmp_path, pingmesh_config_file=tmp_path / "cfg.yaml", pingmesh_topology_file=tmp_path / "topo.json",
        pingmesh_collect_interval_s=0.2, pingmesh_file_poll_s=0.1, node="node-1",
    )  # fmt: skip
    try:
        for _ in range(100):
            if len(app.state.ping_results) >= 16:
                break
            await asyncio.sleep(0.05)
        assert len(app.state.ping_results) >= 16 and comp.status()["activate"]
        # chip reset on phy 2: its tasks vanish; the loop restarts them
        fab.main(["inject", str(fabric_file), "chip_reset", "--node", "node-1", "--phy", "2", "--id", "x"])
        for _ in range(100):
            if comp.m_restarts._value.get() >= 2:
                break
            await asyncio.sleep(0.05)
        assert comp.m_restarts._value.get() >= 2
        assert comp.backend.state(2, 0) == 1
        # an activate=off config stops the tasks
        (tmp_path / "cfg.yaml").write_text('global: {"activate": "off", "task_interval": 1}\n')
        for _ in range(100):
            if comp.activation is not None and not comp.activation.activate:
                break
            await asyncio.sleep(0.05)
        assert comp.backend.state(0, 0) == 0
    finally:
        await comp.stop()
        await app.tasks.close()


def test_csv_rollover_and_cut_lines(tmp_path):
    t = [1000.0]
    w = res.ResultWriter("n", tmp_path, tmp_path, max_age_days=1, clock=lambda: t[0])
    row = agent_pb2.PingResult(ping_task_id=0, src_type="0", src_addr="1", dst_type="0", dst_addr="2",
                               min_delay=-1, max_delay=-1, avg_delay=-1, min_loss_rate=1.0, max_loss_rate=1.0,
                               avg_loss_rate=1.0, timestamp_ms=1755687818727)  # fmt: skip
    p = w.write_csv("0", 3, [row])
    assert p.read_text().splitlines() == [
        res.CSV_HEADER,
        "0,0,1,0,2,-1,-1,-1,1.000,1.000,1.000,1755687818727",
    ]
    t[0] += 30
    w.write_csv("0", 3, [row])
    assert len(p.read_text().splitlines()) == 3 and not p.with_suffix(".csv-bak").exists()
    t[0] += 20  # 50 s after the file was started: roll over
    w.write_csv("0", 3, [row])
    assert len(p.read_text().splitlines()) == 2
    assert len(p.with_suffix(".csv-bak").read_text().splitlines()) == 3
    assert oct(p.stat().st_mode & 0o777) == "0o644"
    # a CSV cut mid-line: the cut line and a malformed line are counted and skipped
    p.write_text(res.CSV_HEADER + "\n" + res.csv_line(row) + "\n0,0,1,0,2,abc,1,1,0,0,0,1\n0,0,1,0,2,1")
    rows, bad = res.read_csv_rows(p)
    assert len(rows) == 1 and bad == 2 and rows[0].avg_loss_rate == 1.0


def test_log_rotation_and_retention(tmp_path):
    t = [2_000_000.0]
    w = res.ResultWriter(
        "n", tmp_path, None, max_age_days=1, max_bytes=200, max_backups=2, clock=lambda: t[0]
    )
    for _ in range(6):
        w.write_round("u" * 64, "cfg", [], {})
        t[0] += 1
    backups = sorted(tmp_path.glob("n-*.log"))
    assert 1 <= len(backups) <= 2 and w.log_path.exists()
    t[0] += 3 * 86400
    for b in backups:
        import os

        os.utime(b, (t[0] - 2 * 86400, t[0] - 2 * 86400))
    w.write_round("u", "cfg", [], {})
    assert all(b not in set(tmp_path.glob("n-*.log")) for b in backups)
    assert w.csv_path("0", 1) is None
    long = res.TaskSample(0, 4194304, 0, HccspingInfo([]))
    w.write_round("u", "x" * 5000, [long], {})
    assert max(len(line) for line in w.log_path.read_text().splitlines()) <= res.MAX_LINE
