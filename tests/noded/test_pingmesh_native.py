"""The hccsping ctypes binding against the C test library (tests/native/hccsping_sim.c), alone and
under noded's pingmesh component (backend dcmi)."""

from __future__ import annotations

import argparse
import ctypes
import types

import pytest
from native.build import build_libs

from clusterd.detectors import fdol_edge as edge
from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentState
from faultmesh.dcmi import hccsping as h
from faultmesh.runtime import BlockingPool
from faultmesh.source import SourceContext
from fdol.slownet import config as pmconfig
from fdol.slownet import topology as topo
from noded.pingmesh import Pingmesh


@pytest.fixture(scope="session")
def libdcmi():
    try:
        return str(build_libs().dcmi)
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture
def hcc(libdcmi):
    b = h.DcmiHccsping.open(libdcmi)
    lib = b.dcmi.lib
    lib.symbol("dcmitest_reset", None, ctypes.c_int, ctypes.c_int)(2, 2)  # 4 chips, phy = logic
    lib.symbol("hccsimtest_reset", None)()
    return b


def ctl(b, name, *argtypes, restype=ctypes.c_int):
    return b.dcmi.lib.symbol(name, restype, *argtypes)


def test_struct_layouts_match_c(hcc):
    size = ctl(hcc, "hccsimtest_sizeof", ctypes.c_char_p)
    assert size(b"dcmi_hccsping_mesh_operate") == ctypes.sizeof(h.HccspingMeshOperate) == 1048
    assert size(b"dcmi_hccsping_mesh_info") == ctypes.sizeof(h.HccspingMeshInfo)


def test_start_state_info_stop_and_chip_reset(hcc):
    chips = hcc.chips()
    assert [(c.phy_id, c.card, c.device) for c in chips] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert chips[2].super_pod_id == -1 and chips[2].server_index == -1  # 0xffffffff in the test library
    assert hcc.supported()
    hcc.start(2, h.PingOp(("101", "102", "103"), task_id=1, task_interval=5))
    buf = ctypes.create_string_buffer(64)
    assert (
        ctl(
            hcc, "hccsimtest_started", ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int
        )(1, 0, 1, buf, 64)
        == 1792
    )
    assert buf.value == b"101,102,103"
    assert hcc.state(2, 1) == 1 and hcc.state(2, 0) == 0
    ctl(hcc, "hccsimtest_set_path", ctypes.c_char_p, ctypes.c_int, ctypes.c_long)(b"102", 300, 40)
    ctl(hcc, "hccsimtest_set_path", ctypes.c_char_p, ctypes.c_int, ctypes.c_long)(b"103", 1000, 0)
    ctl(hcc, "hccsimtest_rounds", ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)(1, 0, 1, 3)
    info = hcc.info(2, 1)
    assert info.dest_num == 3
    d1, d2, d3 = info.dests
    assert (d1.addr, d1.suc, d1.fail, d1.avg_time, d1.reply_stat_num, d1.ping_total_num) == (
        "101",
        30,
        0,
        3,
        3,
        3,
    )
    assert (d2.suc, d2.fail, d2.min_time, d2.avg_time, d2.max_time, d2.tp95_time) == (21, 9, 39, 40, 41, 41)
    assert (d3.suc, d3.fail, d3.avg_time, d3.min_time) == (0, 30, -1, -1)
    assert hcc.info(2, 1).dests[0].ping_total_num == 4
    # a driver that reports more than 48 destinations is rejected
    ctl(hcc, "hccsimtest_set_dest_num", ctypes.c_int, ctypes.c_int, ctypes.c_int)(1, 0, 49)
    with pytest.raises(ValueError, match="dest_num 49"):
        hcc.info(2, 1)
    # chip reset: the task is gone
    ctl(hcc, "hccsimtest_wipe", ctypes.c_int, ctypes.c_int)(1, 0)
    assert hcc.state(2, 1) == 0 and hcc.info(2, 1).dest_num == 0
    hcc.start(2, h.PingOp(("101",), task_id=0))
    hcc.stop(2, 0)
    assert hcc.state(2, 0) == 0


def test_bad_parameters_never_reach_the_driver(hcc):
    with pytest.raises(h.HccspingParamError):
        hcc.start(0, h.PingOp(("1",), pkt_size=4000))
    with pytest.raises(ValueError, match="physical id 9"):
        hcc.start(9, h.PingOp(("1",)))
    # the driver's own check (a list the Python side would not send) gives a DcmiError
    op = h.HccspingMeshOperate(
        pkt_size=1792, pkt_send_num=10, pkt_interval=10, timeout=1, task_interval=1, task_id=3
    )
    op.dst_addr_list = b"1"
    with pytest.raises(Exception, match="-8001"):
        hcc._start(0, 0, 0, ctypes.byref(op))


async def test_noded_pingmesh_source_on_the_c_library(hcc, libdcmi, tmp_path):
    p = argparse.ArgumentParser()
    Pingmesh.add_arguments(p)
    args = p.parse_args(["--pingmesh-backend", "dcmi", "--pingmesh-dcmi-lib", libdcmi,
                         "--pingmesh-dir", str(tmp_path), "--pingmesh-collect-interval-s", "3600"])  # fmt: skip
    ctx = SourceContext("pingmesh", "n1", AgentState("n1"), BlockingPool(2), config=args)
    app = types.SimpleNamespace(state=ctx.state, tasks=ctx.tasks)
    comp = Pingmesh.from_config(args)
    await comp.start(ctx)
    try:
        assert comp.backend_name == "dcmi" and sorted(comp.chips) == [0, 1, 2, 3]
        sp = topo.build_super_pod(4, ["n1", "n2"], npus_per_node=4)
        mine, peer = sp.nodes["n1"].devices, sp.nodes["n2"].devices
        await comp.on_control(agent_pb2.ControlMessage(topology=edge.topology_to_pb(sp)))
        assert comp.super_pod_id == "4"  # from the topology: the test driver has no super-pod info
        cfg = pmconfig.parse_config({"4": {"activate": "on", "task_interval": 2}})
        await comp.on_control(agent_pb2.ControlMessage(pingmesh_config=edge.config_to_pb(cfg)))
        lst = agent_pb2.PingList(super_pod_id="4", tasks=[
            agent_pb2.PingTask(src_phy_id=0, dst_addrs=[str(mine[1]), str(peer[0])]),
            agent_pb2.PingTask(src_phy_id=1, dst_addrs=[str(mine[0])])])  # fmt: skip
        await comp.on_control(agent_pb2.ControlMessage(ping_list=lst))
        await comp._reconcile()
        assert sorted(comp.plan) == [(0, 0), (0, 1), (1, 0)]
        ctl(hcc, "hccsimtest_set_path", ctypes.c_char_p, ctypes.c_int, ctypes.c_long)(
            str(peer[0]).encode(), 500, 9
        )
        assert await comp.collect_once() == 3
        rows = {(r.src_addr, r.dst_addr): r for r in app.state.ping_results}
        r = rows[(str(mine[0]), str(peer[0]))]
        assert (r.ping_task_id, r.avg_loss_rate, r.avg_delay, r.super_pod_id) == (1, 0.5, 9.0, "4")
        assert (tmp_path / "cluster" / "super-pod-4" / "ping_result_1.csv").exists()
        # chip reset of phy 0 (card 0 dev 0): both its tasks restarted by the next collection
        ctl(hcc, "hccsimtest_wipe", ctypes.c_int, ctypes.c_int)(0, 0)
        assert await comp.collect_once() == 1
        assert comp.m_restarts._value.get() == 2 and hcc.state(0, 0) == 1 and hcc.state(0, 1) == 1
    finally:
        await comp.stop()
        await app.tasks.close()
        ctx.pool.shutdown()
    assert hcc.state(1, 0) == 0  # stop() stopped the tasks
