"""The public-fault cap (issue 19 #2): counted as the reference counts it (one item per influence
entry), over public faults only, checked against what a request would add before anything is
applied, and a request over it refused with a reason (never answered 0 while dropped)."""

from __future__ import annotations

import time

from support import public_request

from faultmesh._pb import pubfault_pb2
from faultmesh.model import Fault


def _request(fault_ids, nodes, devices, rid="req-cap-0001"):
    now = int(time.time() * 1000)
    return pubfault_pb2.PublicFaultRequest(
        id=rid,
        timestamp=now,
        version="1.0",
        resource="CCAE",
        faults=[
            pubfault_pb2.Fault(
                faultId=fid,
                faultType="NPU",
                faultCode="010001001",
                faultTime=now,
                assertion="occur",
                influence=[pubfault_pb2.PubFaultInfo(nodeName=n, deviceIds=list(devices)) for n in nodes],
            )
            for fid in fault_ids
        ],
    )


async def test_a_172_kib_request_of_128000_device_faults_is_refused_whole(cd):
    req = _request([f"fault-big-{i}" for i in range(4)], [f"node-{n:04d}" for n in range(1000)], range(32))
    assert 160_000 < req.ByteSize() < 200_000
    resp = await cd.pubfault.intake(req)
    assert resp.code == 409
    assert (
        "public fault cache full" in resp.info
        and "128000" in resp.info
        and "nothing was applied" in resp.info
    )
    assert len(cd.center) == 0
    assert (await cd.pubfault.intake(public_request("fault-small-1"))).code == 0


async def test_items_are_counted_per_influence_entry_and_checked_before_applying(cd, monkeypatch):
    cd.pubfault.max_items = 3  # --public-fault-max-items
    ok = _request(["fault-cap-a"], ["node-a", "node-b", "node-c"], [0, 1], rid="req-cap-0002")
    assert (await cd.pubfault.intake(ok)).code == 0  # 3 items (6 device faults)
    assert len(cd.center) == 6
    assert (await cd.pubfault.intake(ok)).code == 0  # a repeated occur adds nothing
    over = _request(["fault-cap-b"], ["node-a"], [0], rid="req-cap-0003")
    resp = await cd.pubfault.intake(over)
    assert resp.code == 409 and "adds 1 items to 3, limit 3" in resp.info
    assert len(cd.center) == 6
    assert cd.rejected.labels("pubfault", "cache_full")._value.get() == 1


async def test_agents_faults_do_not_use_the_public_cap(cd):
    agent_faults = [
        Fault("noded", f"node-{i // 8:05d}", "NPU", i % 8, "8C1F8609", "SeparateFault") for i in range(50_000)
    ]
    await cd.center.apply(agent_faults, [], "noded")
    assert len(cd.center) == 50_000
    resp = await cd.pubfault.intake(public_request("fault-after-agents", node="node-other"))
    assert resp.code == 0
    assert [f.attributes["faultId"] for f in cd.center.faults("node-other")] == ["fault-after-agents"]
