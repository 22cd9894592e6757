"""clusterd's RoCE parameter plane between super pods (issue 16): built from the super pods'
RoceIP when pingmesh-config has a roce entry, fed by the reference's super-pod-roce result CSVs,
a dead RoCE port localized to its node's NPU; no roce entry, no plane."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from support import make_clusterd

from faultmesh._pb import agent_pb2
from faultmesh.model import now_ms
from fdol.slownet import config as pmconfig
from noded.pingmesh.results import ResultWriter
from noded.pingmesh.rocefabric import RoceFabric

PODS = {str(s): [f"sp{s}-n{i}" for i in range(5)] for s in (1, 2, 3)}
CFG = {"global": {"activate": "on", "task_interval": 1}, "roce": {"activate": "on", "task_interval": 1}}


def slownet(cd):
    return next(c for c in cd.components if c.name == "slownet")


async def test_roce_plane_from_topologies_and_csv_rows(tmp_path):
    fabric = RoceFabric({"roce": True, "super_pods": PODS, "seed": 3, "faults": []})
    cd = await make_clusterd(tmp_path, "--slownet-period-s", "0.5", "--slownet-grace-s", "0.1",
                             "--slownet-csv-root", str(tmp_path / "ras"))  # fmt: skip
    base = f"http://{cd.http.host}:{cd.http.port}"
    try:
        comp = slownet(cd)
        async with aiohttp.ClientSession() as s:
            for sp in fabric.super_pods():
                async with s.post(f"{base}/v1/pingmesh/topology", data=json.dumps(sp.to_json_obj())) as r:
                    assert r.status == 200, await r.text()
            assert "roce" not in comp.pods  # no roce entry in the config yet
            async with s.post(f"{base}/v1/pingmesh/config", data=json.dumps(CFG)) as r:
                assert r.status == 200
            plane = comp.roce_plane
            assert plane is not None and sorted(plane.pods) == ["1", "2", "3"] and "roce" in comp.pods
            roce_json = tmp_path / "ras" / "cluster" / "super-pod-roce" / "super-pod-roce.json"
            assert json.loads(roce_json.read_text()) == {"superPodList": [1, 2, 3]}
            m = comp.roce_list_pb("sp1-n0")
            assert m.super_pod_id == "roce" and [list(t.dst_addrs) for t in m.tasks] == [
                ["10.2.0.1", "10.3.0.1"]
            ]
            dead = plane.pods["2"][3]
            writers = {e.node: ResultWriter(e.node, tmp_path / "logs", tmp_path / "ras") for v in plane.pods.values()
                       for e in v}  # fmt: skip
            for _ in range(60):
                ts = now_ms()
                for v in plane.pods.values():
                    for e in v:
                        rows = []
                        for ips in plane.node_ping_list(e.node).values():
                            for ip in ips:
                                lost = dead.ip in (ip, e.ip)
                                rows.append(agent_pb2.PingResult(
                                    ping_task_id=0, src_type="0", src_addr=e.ip, dst_type="0", dst_addr=ip,
                                    min_delay=-1 if lost else 20, max_delay=-1 if lost else 20,
                                    avg_delay=-1 if lost else 20, min_loss_rate=0, max_loss_rate=0,
                                    avg_loss_rate=1.0 if lost else 0.0, timestamp_ms=ts))  # fmt: skip
                        writers[e.node].write_csv(e.super_pod_id, e.server_index, rows, roce=True)
                faults = [f for f in cd.center.faults() if f.source == "slownet"]
                if faults:
                    break
                await asyncio.sleep(0.15)
            assert [(f.node, f.device_type, f.device_id, f.attributes["superPodId"]) for f in faults] == [
                (dead.node, "NPU", dead.phy, "roce")
            ]
            async with s.get(f"{base}/v1/pingmesh/roce") as r:
                body = await r.json()
            assert r.status == 200 and body["alarms"][0]["kind"] == "npu"
        # the roce entry removed: the plane goes
        await comp.set_config(pmconfig.parse_config({"global": CFG["global"]}), "test")
        assert comp.roce_plane is None and "roce" not in comp.pods
    finally:
        await cd.stop()
