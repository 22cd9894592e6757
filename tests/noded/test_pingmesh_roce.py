"""noded's RoCE pings over the simulated RoCE plane (issue 16): a pushed roce ping list is probed
when pingmesh-config's roce entry is on; rows and the super-pod-roce CSV; a dead port shows as loss;
a bad list is rejected and the last good one stays."""

from __future__ import annotations

import argparse
import json

import pytest

from clusterd.detectors import fdol_edge as edge
from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentState
from faultmesh.files import atomic_write
from faultmesh.runtime import BlockingPool
from faultmesh.source import SourceContext
from fdol.slownet import config as pmconfig
from fdol.slownet import roce
from fmtools.sims import fabric as fab
from noded.pingmesh import Pingmesh
from noded.pingmesh import results as res
from noded.pingmesh.rocefabric import RoceFabric

PODS = {
    "1": ["node-0"] + [f"a{i}" for i in range(4)],
    "2": [f"b{i}" for i in range(5)],
    "3": [f"c{i}" for i in range(5)],
}


async def started(tmp_path, roce_spec):
    fab.write_fabric_file(
        tmp_path / "fabric.json", {"nodes": ["node-0", "node-1"], "npus_per_node": 4, "faults": []}
    )
    atomic_write(tmp_path / "roce.json", json.dumps(roce_spec))
    p = argparse.ArgumentParser()
    Pingmesh.add_arguments(p)
    args = p.parse_args(["--pingmesh-backend", "sim", "--pingmesh-fabric", str(tmp_path / "fabric.json"),
                         "--pingmesh-dir", str(tmp_path / "pm"), "--pingmesh-roce-fabric", str(tmp_path / "roce.json"),
                         "--pingmesh-collect-interval-s", "3600"])  # fmt: skip
    ctx = SourceContext("pingmesh", "node-0", AgentState("node-0"), BlockingPool(2), config=args)
    comp = Pingmesh.from_config(args)
    await comp.start(ctx)
    return ctx, comp


def ctl(**body):
    return agent_pb2.ControlMessage(seq=1, **body)


async def test_roce_list_is_probed_when_the_roce_entry_is_on(tmp_path):
    spec = {"roce": True, "super_pods": PODS, "seed": 4, "faults": []}
    ctx, comp = await started(tmp_path, spec)
    try:
        plane = roce.build_plane(RoceFabric(spec).super_pods())
        lst = plane.node_ping_list("node-0")
        uid = "u1"
        m = agent_pb2.PingList(super_pod_id="roce", uid=uid,
                               tasks=[agent_pb2.PingTask(src_phy_id=p, dst_addrs=d) for p, d in lst.items()])  # fmt: skip
        await comp.on_control(ctl(ping_list=m))
        cfg = {"global": '{"activate":"on","task_interval":1}'}
        await comp.on_control(ctl(pingmesh_config=edge.config_to_pb(pmconfig.parse_config(cfg))))
        assert await comp.collect_roce() == 0  # no roce entry: nothing probed
        cfg["roce"] = '{"activate":"on","task_interval":1}'
        await comp.on_control(ctl(pingmesh_config=edge.config_to_pb(pmconfig.parse_config(cfg))))
        assert await comp.collect_roce() == 2
        rows = [r for r in ctx.state.ping_results if r.super_pod_id == "roce"]
        assert {(r.src_addr, r.dst_addr, r.avg_loss_rate) for r in rows} == {
            ("10.1.0.1", "10.2.0.1", 0.0),
            ("10.1.0.1", "10.3.0.1", 0.0),
        }
        assert all(15 < r.avg_delay < 40 for r in rows)
        csv = tmp_path / "pm" / "cluster" / "super-pod-roce" / "ping_result_0_1.csv"
        assert csv.read_text().splitlines()[0] == res.CSV_HEADER
        assert comp.status()["roce"]["ip"] == "10.1.0.1"
        # a dead RoCE port on the far side: that destination loses everything
        spec["faults"] = [{"kind": "dead_npu", "node": "c0"}]
        atomic_write(tmp_path / "roce.json", json.dumps(spec))
        await comp.collect_roce()
        last = {r.dst_addr: r for r in ctx.state.ping_results if r.super_pod_id == "roce"}
        assert last["10.3.0.1"].avg_loss_rate == 1.0 and last["10.3.0.1"].avg_delay == -1
        assert last["10.2.0.1"].avg_loss_rate == 0.0
        # a bad list is rejected; the previous one stays
        bad = agent_pb2.PingList(
            super_pod_id="roce", uid="u2", tasks=[agent_pb2.PingTask(src_phy_id=0, dst_addrs=["10.2.0"])]
        )
        with pytest.raises(ValueError, match="IPv4"):
            await comp.on_control(ctl(ping_list=bad))
        assert comp.roce.uid == uid and comp.roce.tasks == {0: ["10.2.0.1", "10.3.0.1"]}
    finally:
        await comp.stop()
        await ctx.tasks.close()
