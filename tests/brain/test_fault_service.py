"""fault.Fault: Register / SubscribeFaultMsgSignal / GetFaultMsgSignal codes, mapping, dedup, normal (§2.4)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from brain.brainkit import JOB, apply, npu_fault

from clusterd.brain import faultsvc
from faultmesh._pb import fault_pb2 as pb
from faultmesh._pb import fault_pb2_grpc
from faultmesh.model import Fault


@pytest.fixture
def stub(channel):
    return fault_pb2_grpc.FaultStub(channel)


def ci(job=JOB, role="platform"):
    return pb.ClientInfo(jobId=job, role=role)


async def test_register_codes(cd, stub, monkeypatch):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Register(ci(role=""))
    assert "role is empty" in e.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Register(ci())
    assert "402" in e.value.details()
    assert (await stub.Register(ci(job=""))).code == 0  # whole cluster
    await apply(cd)
    assert (await stub.Register(ci())).code == 0
    monkeypatch.setattr(faultsvc, "MAX_JOB_IDS", 2)
    await apply(cd, id="job-0002-uid", name="other")
    r = await stub.Register(ci(job="job-0002-uid"))
    assert r.code == 500
    assert (await stub.Register(ci(role="again"))).code == 0  # an existing job id is fine


async def test_subscribe_needs_register(stub):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.SubscribeFaultMsgSignal(ci()).read()
    assert "not registered" in e.value.details()


async def read(call, timeout_s=5.0):
    return await asyncio.wait_for(call.read(), timeout_s)


async def test_job_stream_fault_dedup_and_normal(cd, stub):
    await apply(cd)
    cd.nodes.hello("node-b", "10.0.0.2", "SN-B", "")
    await stub.Register(ci())
    call = stub.SubscribeFaultMsgSignal(ci())
    await asyncio.sleep(0.1)
    await cd.center.upsert(npu_fault(code="80E18402", level="RestartNPU"))
    m = await read(call)
    assert (m.jobId, m.signalType, len(m.uuid)) == (JOB, "fault", 36)
    (node,) = m.nodeFaultInfo
    assert (node.nodeName, node.nodeIP, node.nodeSN, node.faultLevel) == (
        "node-b",
        "10.0.0.2",
        "SN-B",
        "UnHealthy",
    )
    assert [(d.deviceId, d.deviceType, list(d.faultCodes), d.faultLevel) for d in node.faultDevice] == [
        ("0", "NPU", ["80E18402"], "UnHealthy")
    ]
    # same content again (only last_seen moves): no message
    await cd.center.upsert(npu_fault(code="80E18402", level="RestartNPU").with_times(0, 1))
    pending = asyncio.ensure_future(call.read())
    done, _ = await asyncio.wait([pending], timeout=0.3)
    assert not done
    await cd.center.remove(npu_fault().key)
    m = await asyncio.wait_for(pending, 5)  # the pending read completes with "normal"
    assert (m.signalType, list(m.nodeFaultInfo)) == ("normal", [])
    call.cancel()


async def test_level_mapping_grouping_and_filters(cd, stub):
    await apply(cd)
    await cd.center.apply(
        [
            npu_fault(dev=1, code="80818C05", level="SubHealthFault"),
            npu_fault(dev=1, code="80E18402", level="RestartNPU"),
            npu_fault(
                dev=1, code="80E18402", level="SeparateNPU", source="other"
            ),  # duplicate code: worst kept
            npu_fault(dev=0, code="1111", level="NotHandleFault"),  # filtered
            npu_fault(dev=9, code="2222", level="SeparateNPU"),  # not a job device
            Fault("noded", "node-b", "CPU", -1, "00000003", "PreSeparateFault"),
        ],
        [],
        "test",
    )
    r = await stub.GetFaultMsgSignal(ci())
    assert (r.code, r.info) == (200, "all info returned")
    (node,) = r.faultSignal.nodeFaultInfo
    devs = [
        (d.deviceId, d.deviceType, list(d.faultCodes), d.faultLevel, list(d.faultLevels))
        for d in node.faultDevice
    ]
    assert devs == [
        ("-1", "CPU", ["00000003"], "SubHealthy", ["PreSeparateFault"]),
        ("1", "NPU", ["80818C05", "80E18402"], "UnHealthy", ["SubHealthFault", "SeparateNPU"]),
    ]
    assert node.faultLevel == "UnHealthy"


async def test_cluster_subscriber_gets_one_message_per_job(cd, stub):
    await apply(cd)
    await apply(cd, id="job-0002-uid", name="other", ranks=[{"rank": 0, "node": "node-b", "device": 0}])
    await stub.Register(ci(job=""))
    call = stub.SubscribeFaultMsgSignal(ci(job=""))
    await asyncio.sleep(0.1)
    await cd.center.upsert(npu_fault(dev=0))
    got = sorted([(await read(call)).jobId for _ in range(2)])
    assert got == [JOB, "job-0002-uid"]
    call.cancel()


async def test_register_again_ends_the_old_stream(cd, stub):
    await apply(cd)
    await stub.Register(ci())
    old = stub.SubscribeFaultMsgSignal(ci())
    await asyncio.sleep(0.1)
    await stub.Register(ci())
    assert await read(old) is grpc.aio.EOF


async def test_get_codes(cd, stub, monkeypatch):
    await apply(cd)
    for bad in ("short", "x" * 129, "作业作业作业作业作业"):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.GetFaultMsgSignal(ci(job=bad))
        assert "409" in e.value.details()
    r = await stub.GetFaultMsgSignal(ci(job="unknown-job-id"))
    assert r.code == 200 and not r.HasField("faultSignal")
    cd.nodes.hello("node-a", "10.0.0.9", "", "")
    cd.nodes.hello("node-b", "10.0.0.1", "", "")
    await cd.center.apply([npu_fault(node="node-a"), npu_fault(node="node-b")], [], "test")
    r = await stub.GetFaultMsgSignal(ci(job=""))
    assert r.faultSignal.jobId == "-1" and [n.nodeName for n in r.faultSignal.nodeFaultInfo] == [
        "node-b",
        "node-a",
    ]


async def test_get_rate_limit_429(cd, stub, monkeypatch):
    monkeypatch.setattr(faultsvc, "QUEUE_WAIT_S", 0.2)
    monkeypatch.setattr(faultsvc, "MAX_WAITING", 5)
    cd.brain.fault._bucket = faultsvc.TokenBucket(0.001, 10)
    results = await asyncio.gather(
        *(stub.GetFaultMsgSignal(ci(job="")) for _ in range(20)), return_exceptions=True
    )
    ok = [r for r in results if not isinstance(r, Exception)]
    limited = [r for r in results if isinstance(r, grpc.aio.AioRpcError) and "429" in r.details()]
    assert len(ok) == 10 and len(limited) == 10


async def test_a_mindie_controller_subscribes_with_its_service_id_and_gets_the_service(cd, stub):
    # MindIE's controller registers with the service's jobID and its own app type (the reference's
    # preRegistry: GetNamespaceByJobIdAndAppType), and is told the faults of every job of the service
    from brain.brainkit import MINDIE, apply_specs, mindie_specs

    await apply_specs(cd, mindie_specs())
    with pytest.raises(grpc.aio.AioRpcError, match="402"):
        await stub.Register(pb.ClientInfo(jobId=MINDIE, role="platform"))  # no job of that app type
    ci = pb.ClientInfo(jobId=MINDIE, role="mindie-ms-controller")
    assert (await stub.Register(ci)).code == 0
    call = stub.SubscribeFaultMsgSignal(ci)
    await cd.center.upsert(npu_fault(node="node-s0-0", dev=1))
    await cd.center.upsert(npu_fault(node="node-s1-0", dev=0, code="80E18008"))
    got: dict[str, set] = {}
    while len(got) < 2:
        sig = await asyncio.wait_for(call.read(), 5)
        assert sig.jobId == MINDIE and sig.signalType == "fault"
        got = {n.nodeName: {c for d in n.faultDevice for c in d.faultCodes} for n in sig.nodeFaultInfo}
    assert got == {"node-s0-0": {"80E18402"}, "node-s1-0": {"80E18008"}}
    call.cancel()
