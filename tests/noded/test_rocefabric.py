"""The simulated RoCE plane between super pods: addresses, faults only where injected, bad specs."""

from __future__ import annotations

import pytest

from noded.pingmesh.fabric import FabricError
from noded.pingmesh.rocefabric import RoceFabric

PODS = {"1": ["a0", "a1", "a2"], "2": ["b0", "b1", "b2"], "3": ["c0", "c1", "c2"]}


def fab(*faults, **kw):
    return RoceFabric({"roce": True, "super_pods": PODS, "seed": 2, "faults": list(faults), **kw})


def probe(f, src, dst, packets=200):
    suc, fail, avg = f.probe_many([(src, f.nodes[dst][2])], packets)
    return int(suc[0]), int(fail[0]), float(avg[0])


def test_addresses_topologies_and_base_rtt():
    f = fab()
    assert f.nodes["b1"] == ("2", 2, "10.2.0.2")
    sps = f.super_pods()
    assert [sp.super_pod_id for sp in sps] == ["1", "2", "3"]
    assert {n.name: n.roce_ip for n in sps[2].nodes.values()} == {
        "c0": "10.3.0.1",
        "c1": "10.3.0.2",
        "c2": "10.3.0.3",
    }
    suc, fail, avg = probe(f, "a0", "b0")
    assert (suc, fail) == (200, 0) and 15 < avg < 21  # 12 + 2 hops of 3 µs
    assert f.probe_many([("a0", "10.9.9.9")], 10)[1][0] == 10  # an unknown IP never answers


@pytest.mark.parametrize(
    "fault, bad, good",
    [
        ({"kind": "dead_npu", "node": "b1"}, ("a1", "b1"), ("a1", "b2")),
        ({"kind": "lossy_link", "a": "a0", "b": "c0", "loss": 0.5}, ("c0", "a0"), ("a0", "b0")),
        ({"kind": "pod_uplink", "super_pod": "3", "loss": 0.5}, ("b2", "c1"), ("a2", "b2")),
        ({"kind": "switch", "loss": 0.5}, ("a0", "b0"), None),
    ],
)
def test_faults_lose_packets_only_where_injected(fault, bad, good):
    f = fab(fault)
    assert probe(f, *bad)[1] > 50
    if good:
        assert probe(f, *good)[1] == 0


def test_slow_link_and_bad_specs():
    f = fab({"kind": "slow_link", "a": "a0", "b": "b0", "delay_us": 40})
    assert probe(f, "b0", "a0")[2] > 50 and probe(f, "a0", "c0")[2] < 25
    for spec, why in [
        ({"super_pods": {"1": ["a"]}}, "2 super pods"),
        ({"super_pods": {"1": ["a"], "2": ["a"]}}, "two super pods"),
        ({"super_pods": PODS, "faults": [{"kind": "pod_uplink", "super_pod": "9"}]}, "no super pod"),
        ({"super_pods": PODS, "faults": [{"kind": "dead_npu", "node": "zz"}]}, "no node"),
        (
            {"super_pods": PODS, "faults": [{"kind": "lossy_link", "a": "a0", "b": "b0", "loss": 2}]},
            "outside",
        ),
    ]:
        with pytest.raises(FabricError, match=why):
            RoceFabric(spec)
