"""clusterd slownet component in-process: HTTP inputs (auth, bad input), pushes to a connecting noded,
persistence of inputs across a restart, restored faults kept until the analysis has warmed up."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from support import make_clusterd

from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentClient
from faultmesh.model import Fault
from fdol.slownet import topology as topo

SP = topo.build_super_pod(0, ["node-0", "node-1"], npus_per_node=4)
CFG = {"global": {"activate": "on", "task_interval": 1}}


def append_text(path, text):
    with open(path, "a") as fh:
        fh.write(text)


def slownet_component(cd):
    return next(c for c in cd.components if c.name == "slownet")


async def test_http_inputs_push_and_restart(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cd = await make_clusterd(
        tmp_path, "--token-file", str(token), "--slownet-period-s", "0.5", "--slownet-grace-s", "0.2"
    )
    base = f"http://{cd.http.host}:{cd.http.port}"
    auth = {"Authorization": "Bearer s3cret"}
    got: list[agent_pb2.ControlMessage] = []

    async def on_control(msg):
        got.append(msg)

    agent = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", on_control=on_control, token="s3cret")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/v1/pingmesh/topology", data=json.dumps(SP.to_json_obj())) as r:
                assert r.status == 401
            async with s.post(f"{base}/v1/pingmesh/topology", data="{broken", headers=auth) as r:
                assert r.status == 400 and "not JSON" in (await r.json())["error"]
            await agent.start()
            await asyncio.wait_for(agent.connected.wait(), 10)
            async with s.post(
                f"{base}/v1/pingmesh/topology", data=json.dumps(SP.to_json_obj()), headers=auth
            ) as r:
                assert r.status == 200 and (await r.json())["paths"] == 2 * 4 * 3 + 2 * 4
            async with s.post(
                f"{base}/v1/pingmesh/config", data='{"global": {"activate": "maybe"}}', headers=auth
            ) as r:
                assert r.status == 400
            async with s.post(f"{base}/v1/pingmesh/config", data=json.dumps(CFG), headers=auth) as r:
                assert r.status == 200
            async with s.get(f"{base}/v1/pingmesh") as r:
                body = await r.json()
            assert body["config"] == CFG and body["superPods"][0]["nodesConnected"] == ["node-1"]
            async with s.get(f"{base}/v1/pingmesh/7") as r:
                assert r.status == 404
        # the connected noded got topology, ping list, then config + topology + list again
        for _ in range(100):
            if {m.WhichOneof("body") for m in got} >= {"topology", "ping_list", "pingmesh_config"}:
                break
            await asyncio.sleep(0.05)
        lists = [m.ping_list for m in got if m.WhichOneof("body") == "ping_list"]
        assert lists[-1].super_pod_id == "0" and [t.src_phy_id for t in lists[-1].tasks] == [0, 1, 2, 3]
        assert len(lists[-1].tasks[0].dst_addrs) == 4  # 3 intra + 1 inter
        # a reconnecting noded gets everything again
        await agent.stop()
        got.clear()
        agent = AgentClient(
            f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", on_control=on_control, token="s3cret"
        )
        await agent.start()
        # (first, re-queued, what the stopped agent had not acked yet: clusterd.ingest.control)
        want = ["pingmesh_config", "topology", "ping_list"]
        for _ in range(100):
            if [m.WhichOneof("body") for m in got][-3:] == want:
                break
            await asyncio.sleep(0.05)
        bodies = [m.WhichOneof("body") for m in got]
        assert bodies[-3:] == want and set(bodies[:-3]) <= set(want), bodies
        # a slownet fault in the fault center, then a restart
        await cd.center.upsert(
            Fault(
                "slownet", "node-0", "NPU", 1, "200001010", "NotHandleFault", attributes={"superPodId": "0"}
            )
        )
    finally:
        await agent.stop()
        await cd.stop()
    cd = await make_clusterd(tmp_path, "--slownet-period-s", "0.5", "--slownet-grace-s", "0.2")
    try:
        comp = slownet_component(cd)
        assert comp.config["global"].activate and "0" in comp.pods  # inputs survived the restart
        await asyncio.sleep(1.2)  # analysis ran, but not warm yet: the restored fault stays
        assert [f.code for f in cd.center.faults() if f.source == "slownet"] == ["200001010"]
        for _ in range(80):  # warm after min_baseline + recover_periods = 5 periods: recovered
            if not [f for f in cd.center.faults() if f.source == "slownet"]:
                break
            await asyncio.sleep(0.1)
        assert not [f for f in cd.center.faults() if f.source == "slownet"]
    finally:
        await cd.stop()


async def test_topology_file_folder_and_bad_files(tmp_path):
    d = tmp_path / "net"
    d.mkdir()
    (d / "super-pod-0.json").write_text(json.dumps(SP.to_json_obj()))
    other = topo.build_super_pod(1, ["node-0"], npus_per_node=2)  # node-0 is already in super pod 0
    (d / "super-pod-1.json").write_text(json.dumps(other.to_json_obj()))
    (d / "super-pod-2.json").write_text('{"SuperPodID": "2"}')
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"global": {"activate": "on", "task_interval": 99}}')
    cd = await make_clusterd(tmp_path, "--slownet-topology", str(d), "--slownet-config", str(cfg))
    try:
        comp = slownet_component(cd)
        assert sorted(comp.pods) == ["0"] and comp.config == {}
        assert comp.m_inputs.labels("topology")._value.get() == 2
        assert comp.m_inputs.labels("config")._value.get() == 1
    finally:
        await cd.stop()


async def test_rows_from_shared_result_csv(tmp_path):
    from faultmesh.model import now_ms
    from fdol.slownet import pinglist
    from noded.pingmesh.results import ResultWriter, csv_line

    topo_file = tmp_path / "super-pod-0.json"
    topo_file.write_text(json.dumps(SP.to_json_obj()))
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CFG))
    cd = await make_clusterd(
        tmp_path, "--slownet-topology", str(topo_file), "--slownet-config", str(cfg), "--slownet-period-s", "0.5",
        "--slownet-grace-s", "0.1", "--slownet-csv-root", str(tmp_path / "ras"),
    )  # fmt: skip
    try:
        pairs = pinglist.generate(SP)
        a, b = SP.nodes["node-0"].devices[3], SP.nodes["node-0"].devices[1]
        writers = {n: ResultWriter(n, tmp_path / "logs", tmp_path / "ras") for n in SP.nodes}
        for _ in range(40):
            ts = now_ms()
            for n, w in writers.items():
                rows = [
                    agent_pb2.PingResult(ping_task_id=p.task_id, src_type="0", src_addr=str(p.src_sdid), dst_type="0",
                                         dst_addr=str(p.dst_sdid), min_delay=3, max_delay=3, avg_delay=3,
                                         avg_loss_rate=0.5 if {p.src_sdid, p.dst_sdid} == {a, b} else 0.0,
                                         min_loss_rate=0, max_loss_rate=0, timestamp_ms=ts)
                    for p in pairs if p.src_node == n
                ]  # fmt: skip
                w.write_csv("0", SP.nodes[n].server_index, rows)
            faults = [f for f in cd.center.faults() if f.source == "slownet"]
            if faults:
                break
            await asyncio.sleep(0.15)
        assert [(f.node, f.device_id, f.code) for f in faults] == [("node-0", 1, "200001010")]
        # a line cut mid-write is counted, not fatal
        csv = tmp_path / "ras" / "cluster" / "super-pod-0" / "ping_result_1.csv"
        append_text(csv, csv_line(rows[0])[:20])
        comp = slownet_component(cd)
        for _ in range(40):
            if comp.m_rows.labels("csv_bad_line")._value.get() >= 1:
                break
            await asyncio.sleep(0.1)
        assert comp.m_rows.labels("csv_bad_line")._value.get() >= 1
        # pingmesh switched off for the super pod: nothing is measured, the fault does not linger
        from fdol.slownet import config as pmconfig

        await comp.set_config(pmconfig.parse_config({"0": {"activate": "off", "task_interval": 1}}), "test")
        for _ in range(40):
            if not [f for f in cd.center.faults() if f.source == "slownet"]:
                break
            await asyncio.sleep(0.1)
        assert not [f for f in cd.center.faults() if f.source == "slownet"]
    finally:
        await cd.stop()
