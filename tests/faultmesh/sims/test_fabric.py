"""Fabric simulator: injected faults, ground truth, shared fault file, pure-Python hccsping backend."""

from __future__ import annotations

import json

import pytest

from faultmesh.dcmi.hccsping import HccspingParamError, PingOp
from fmtools.sims import fabric as fab
from noded.pingmesh.simbackend import SimHccsping

NODES = ["node-0", "node-1", "node-2"]


def spec(*faults, planes=2):
    return {"nodes": NODES, "npus_per_node": 4, "planes": planes, "seed": 3, "faults": list(faults)}


def sdid(f, node, phy):
    return f.sp.nodes[node].devices[phy]


def test_clean_fabric_answers_everything_with_base_delays():
    f = fab.Fabric(spec())
    suc, fail, d = f.probe(("node-0", 0), sdid(f, "node-0", 1), 100)
    assert (suc, fail) == (100, 0) and 2.0 < sum(d) / len(d) < 4.0
    suc, fail, d = f.probe(("node-0", 0), sdid(f, "node-2", 0), 100)
    assert suc == 100 and 4.0 < sum(d) / len(d) < 6.0  # inter-node adds 2 µs
    assert f.probe(("node-0", 0), 12345, 10) == (0, 10, [])  # not an SDID of the pod


@pytest.mark.parametrize(
    "fault, probe_ok, probe_bad, truth",
    [
        ({"kind": "dead_npu", "node": "node-1", "phy": 2}, (("node-1", 1), "node-1", 3), (("node-0", 2), "node-1", 2),
         {"kind": "npu", "node": "node-1", "phy": 2}),
        ({"kind": "dead_node", "node": "node-2"}, (("node-0", 1), "node-1", 1), (("node-1", 3), "node-2", 3),
         {"kind": "node", "node": "node-2"}),
        ({"kind": "lossy_link", "a": "node-0/1", "b": "node-0/3", "loss": 0.5}, (("node-0", 1), "node-0", 2),
         (("node-0", 3), "node-0", 1), {"kind": "link", "node": "node-0", "phy": 1, "peer_node": "node-0", "peer_phy": 3}),
        ({"kind": "degraded_plane", "plane": 1, "loss": 0.5}, (("node-0", 0), "node-1", 0), (("node-0", 1), "node-2", 1),
         {"kind": "plane", "plane": 1}),
    ],
)  # fmt: skip
def test_faults_lose_packets_only_where_injected(fault, probe_ok, probe_bad, truth):
    f = fab.Fabric(spec(fault))
    src, node, phy = probe_ok
    assert f.probe(src, sdid(f, node, phy), 200)[1] == 0
    src, node, phy = probe_bad
    suc, fail, _ = f.probe(src, sdid(f, node, phy), 200)
    assert fail > 50
    got = fab.ground_truth(f)
    assert len(got) == 1 and {k: v for k, v in got[0].items() if k != "fault"} == truth


def test_slow_link_adds_delay_both_ways():
    f = fab.Fabric(spec({"kind": "slow_link", "a": {"node": "node-0", "phy": 0}, "b": {"node": "node-1", "phy": 0},
                         "delay_us": 40}))  # fmt: skip
    for src, dst in ((("node-0", 0), ("node-1", 0)), (("node-1", 0), ("node-0", 0))):
        suc, _, d = f.probe(src, sdid(f, *dst), 50)
        assert suc == 50 and sum(d) / len(d) > 40


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "meteor"},
        {"kind": "dead_npu", "node": "node-9", "phy": 0},
        {"kind": "lossy_link", "a": "node-0/1", "b": "node-0/1"},
        {"kind": "lossy_link", "a": "node-0/1", "b": "node-0/2", "loss": 1.5},
        {"kind": "degraded_plane", "plane": 7},
    ],
)
def test_bad_faults_rejected(bad):
    with pytest.raises(fab.FabricError):
        fab.Fabric(spec(bad))


def test_fault_file_is_shared_and_reloaded(tmp_path):
    path = tmp_path / "fabric.json"
    assert fab.main(["init", str(path), "--nodes", ",".join(NODES), "--npus", "4"]) == 0
    a = fab.Fabric.from_file(path, reload_s=0)
    b = fab.Fabric.from_file(path, reload_s=0)  # a second process would do the same
    target = sdid(a, "node-1", 2)
    assert a.probe(("node-0", 2), target, 20)[1] == 0
    assert fab.main(["inject", str(path), "dead_npu", "--node", "node-1", "--phy", "2"]) == 0
    assert a.probe(("node-0", 2), target, 20)[1] == 20
    assert b.probe(("node-2", 2), target, 20)[1] == 20
    # a broken edit is rejected and the previous state kept
    assert fab.main(["inject", str(path), "lossy_link", "--a", "node-0/1", "--b", "node-0/1"]) == 1
    assert fab.main(["clear", str(path)]) == 0
    assert a.probe(("node-0", 2), target, 20)[1] == 0
    assert json.loads(path.read_text())["faults"] == []


def test_topology_and_truth_cli(tmp_path, capsys):
    path = tmp_path / "f.json"
    fab.write_fabric_file(path, spec({"kind": "dead_node", "node": "node-1"}))
    assert fab.main(["topology", str(path)]) == 0
    topo = json.loads(capsys.readouterr().out)
    assert set(topo["NodeDeviceMap"]) == set(NODES) and topo["Planes"] == {"0": [0, 2], "1": [1, 3]}
    assert fab.main(["truth", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kind"] == "node"


ROCE_PODS = ["--super-pod", "1=a-0,a-1", "--super-pod", "2=b-0,b-1"]


def test_roce_cli_init_inject_truth_topology_clear(tmp_path, capsys):
    """The RoCE plane has the HCCS commands under ``roce``; what they write is what noded reads."""
    path = tmp_path / "roce.json"
    assert fab.main(["roce", "init", str(path), *ROCE_PODS, "--npus", "4", "--seed", "2"]) == 0
    clean = fab.RoceFabric(fab.read_spec(path))
    b0 = clean.nodes["b-0"][2]
    assert clean.probe_many([("a-0", b0)], 20)[1].tolist() == [0]
    assert fab.main(["roce", "inject", str(path), "pod_uplink", "--super-pod", "2", "--loss", "1"]) == 0
    assert (
        fab.main(["roce", "inject", str(path), "slow_link", "--a", "b-1", "--b", "a-0", "--delay-us", "40"])
        == 0
    )
    lossy = fab.RoceFabric(fab.read_spec(path))
    assert lossy.probe_many([("a-0", b0), ("a-1", lossy.nodes["a-0"][2])], 20)[1].tolist() == [20, 0]
    assert fab.main(["roce", "truth", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"kind": "superpod", "super_pod": "2", "fault": "pod_uplink"},
        {"kind": "link", "node": "a-0", "phy": 0, "peer_node": "b-1", "peer_phy": 0, "fault": "slow_link"},
    ]
    assert fab.main(["roce", "topology", str(path)]) == 0
    topo = json.loads(capsys.readouterr().out)
    assert [sorted(t["NodeDeviceMap"]) for t in topo] == [["a-0", "a-1"], ["b-0", "b-1"]]
    assert topo[1]["NodeDeviceMap"]["b-0"]["RoceIP"] == b0 == "10.2.0.1"
    # bad edits are refused and the file keeps its last good state
    assert fab.main(["roce", "inject", str(path), "dead_npu", "--node", "nowhere"]) == 1
    assert (
        fab.main(["roce", "inject", str(path), "lossy_link", "--a", "a-0", "--b", "b-0", "--loss", "2"]) == 1
    )
    assert fab.main(["roce", "init", str(tmp_path / "one.json"), "--super-pod", "1=a-0"]) == 1
    assert fab.main(["roce", "init", str(tmp_path / "bad.json"), "--super-pod", "1"]) == 1
    assert "ID=node" in capsys.readouterr().err
    assert not (tmp_path / "one.json").exists() and len(json.loads(path.read_text())["faults"]) == 2
    assert fab.main(["roce", "clear", str(path)]) == 0
    assert json.loads(path.read_text())["faults"] == []


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_sim_hccsping_tasks_rounds_and_chip_reset(tmp_path):
    path = tmp_path / "f.json"
    fab.write_fabric_file(path, spec())
    f = fab.Fabric.from_file(path, reload_s=0)
    clock = Clock()
    sim = SimHccsping(f, "node-0", clock)
    chips = sim.chips()
    assert [c.phy_id for c in chips] == [0, 1, 2, 3] and chips[1].sdid == sdid(f, "node-0", 1)
    dsts = (str(sdid(f, "node-0", 1)), str(sdid(f, "node-1", 0)))
    sim.start(0, PingOp(dsts, task_id=0, task_interval=2))
    assert sim.state(0, 0) == 1 and sim.state(0, 1) == 0
    clock.t += 10
    info = sim.info(0, 0)
    assert info.dest_num == 2
    d0 = info.dests[0]
    assert (d0.addr, d0.suc, d0.fail, d0.reply_stat_num, d0.ping_total_num) == (dsts[0], 50, 0, 5, 5)
    assert 2 <= d0.min_time <= d0.avg_time <= d0.max_time
    # chip reset: tasks wiped once, restart works
    fab.main(["inject", str(path), "chip_reset", "--node", "node-0", "--phy", "0", "--id", "r1"])
    assert sim.state(0, 0) == 0 and sim.info(0, 0).dest_num == 0
    sim.start(0, PingOp(dsts, task_id=0))
    assert sim.state(0, 0) == 1  # the same reset id does not wipe again
    with pytest.raises(HccspingParamError):
        sim.start(0, PingOp(dsts, pkt_size=100))
    with pytest.raises(ValueError):
        sim.start(9, PingOp(dsts))


def test_ping_op_validation():
    PingOp(("1", "2")).validate()
    for bad in (
        PingOp(()),
        PingOp(("1",), task_id=2),
        PingOp(("1",), task_interval=61),
        PingOp(("1",), pkt_send_num=0),
        PingOp(tuple(str(i) for i in range(49))),
        PingOp(("1,2",)),
    ):
        with pytest.raises(HccspingParamError):
            bad.validate()


def test_probe_many_agrees_with_probe():
    f = fab.Fabric(spec({"kind": "dead_npu", "node": "node-1", "phy": 2},
                        {"kind": "slow_link", "a": "node-0/0", "b": "node-0/1", "delay_us": 20}))  # fmt: skip
    probes = [
        ("node-0", 0, sdid(f, "node-1", 2)),
        ("node-0", 0, sdid(f, "node-0", 1)),
        ("node-0", 0, sdid(f, "node-2", 0)),
    ]
    suc, fail, avg = f.probe_many(probes, 50)
    assert list(suc) == [0, 50, 50] and list(fail) == [50, 0, 0]
    assert avg[0] == -1 and avg[1] > 20 and 4 < avg[2] < 6
