"""Recover's O&M RPCs (NIC switch, stress test): codes and info strings as the reference answers them.

Reference: component/clusterd/pkg/application/recover/om_service.go —
- SwitchNicTrack: ``checkNicsParam`` 413 OMParamInvalid "job:%s not exist", "job:%s is not registered",
  "job:%s is not running", "node:%s not exist in job:%s", ``checkDevsValid`` "dev and op length is not
  equal", "dev or op is empty", "device:%s not exist in node:%s", "node:%s should operate in
  superPodID"; 411 OMIsRunning "jobId=%s nic is swtiching, or job recovering"; 0 "switching operation
  was successfully distributed".
- StressTest: ``checkStressTestParam`` 413 "job:%s not exist", "job:%s is not registered", "stress test
  node is nil", "node:%s stress test ops is 0", "node:%s not exist in job:%s", ``validateStressTestOps``
  "op:%v not exist in support operation:%v" ([0 1]), "node:%s stress test ops should not repeat"
  (node "AllNodes" for allNodesOps); 411 "jobId=%s om is running, or job recovering".
- SubscribeSwitchNicSignal / SubscribeStressTestResponse: "jobId=%s not registed", "jobId=%s is not
  swtiching nic" / "jobId=%s is not stress test"; SubscribeNotifySwitch / SubscribeNotifyExecStressTest:
  "jobId=%s not registed, please wait agent register".
faultmesh's own additions (docs/compatibility.md): an empty nicOps and a repeated device are refused.
Their flows: tests/brain/test_om_flows.py.
"""

from __future__ import annotations

import grpc
import pytest
from brain.brainkit import JOB, apply

from faultmesh._pb import recover_pb2 as pb
from faultmesh._pb import recover_pb2_grpc


@pytest.fixture
def stub(channel):
    return recover_pb2_grpc.RecoverStub(channel)


def ci(job=JOB):
    return pb.ClientInfo(jobId=job, role="taskd")


def nic(**nodes):
    return pb.SwitchNics(jobID=JOB, nicOps={n: pb.DeviceList(dev=d, op=o) for n, (d, o) in nodes.items()})


async def registered(cd, stub, **over):
    await apply(cd, **over)
    assert (await stub.Init(ci())).code == 0
    assert (await stub.Register(ci())).code == 0


async def test_switch_nic_track_413_texts(cd, stub):
    one = nic(**{"node-a": (["0"], [True])})
    assert status(await stub.SwitchNicTrack(one)) == (413, f"job:{JOB} not exist")
    await apply(cd)
    assert status(await stub.SwitchNicTrack(one)) == (413, f"job:{JOB} is not registered")
    assert (await stub.Init(ci())).code == 0 and (await stub.Register(ci())).code == 0
    cases = [
        (nic(), "nicOps is empty"),  # faultmesh's own
        (nic(**{"node-x": (["0"], [True])}), f"node:node-x not exist in job:{JOB}"),
        (nic(**{"node-a": (["0", "1"], [True])}), "dev and op length is not equal"),
        (nic(**{"node-a": ([], [])}), "dev or op is empty"),
        (nic(**{"node-a": (["5"], [True])}), "device:5 not exist in node:node-a"),
        (nic(**{"node-a": (["0", "0"], [True, False])}), "node:node-a devices should not repeat"),  # own
    ]
    for req, why in cases:
        assert status(await stub.SwitchNicTrack(req)) == (413, why)
    spec_ranks = [dict(r, superPodId=-1) for r in cd.jobs.get(JOB).to_dict()["ranks"]]
    await apply(cd, ranks=spec_ranks)
    assert status(await stub.SwitchNicTrack(one)) == (413, "node:node-a should operate in superPodID")
    await apply(cd, status="pending")
    assert status(await stub.SwitchNicTrack(one)) == (413, f"job:{JOB} is not running")


async def test_om_411_while_a_flow_runs(cd, stub, sims):
    await apply(cd)
    await sims.start(job_id=JOB, stop="silent")  # pause is never confirmed: the flow stays busy
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["0"], [True])}))
    assert status(r) == (0, "switching operation was successfully distributed")
    r = await stub.SwitchNicTrack(nic(**{"node-a": (["1"], [True])}))
    assert status(r) == (411, f"jobId={JOB} nic is swtiching, or job recovering")
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))
    assert status(r) == (411, f"jobId={JOB} om is running, or job recovering")


async def test_stress_test_413_texts(cd, stub):
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))
    assert status(r) == (413, f"job:{JOB} not exist")
    await apply(cd)
    r = await stub.StressTest(pb.StressTestParam(jobID=JOB, allNodesOps=[0]))
    assert status(r) == (413, f"job:{JOB} is not registered")
    assert (await stub.Init(ci())).code == 0 and (await stub.Register(ci())).code == 0
    sp = pb.StressOpList
    cases = [
        (pb.StressTestParam(jobID=JOB), "stress test node is nil"),
        (pb.StressTestParam(jobID=JOB, allNodesOps=[0, 2]), "op:2 not exist in support operation:[0 1]"),
        (pb.StressTestParam(jobID=JOB, allNodesOps=[1, 1]), "node:AllNodes stress test ops should not repeat"),
        (pb.StressTestParam(jobID=JOB, stressParam={"node-a": sp(ops=[])}), "node:node-a stress test ops is 0"),
        (pb.StressTestParam(jobID=JOB, stressParam={"node-x": sp(ops=[0])}), f"node:node-x not exist in job:{JOB}"),
        (
            pb.StressTestParam(jobID=JOB, stressParam={"node-a": sp(ops=[0, 0])}),
            "node:node-a stress test ops should not repeat",
        ),
    ]  # fmt: skip
    for req, why in cases:
        assert status(await stub.StressTest(req)) == (413, why)


async def stream_error(call) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call.read()
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    return e.value.details()


async def test_om_stream_error_texts(cd, stub):
    await apply(cd)
    assert await stream_error(stub.SubscribeSwitchNicSignal(pb.SwitchNicRequest(jobID=JOB))) == (
        f"jobId={JOB} not registed"
    )
    assert await stream_error(stub.SubscribeStressTestResponse(pb.StressTestRequest(jobID=JOB))) == (
        f"jobId={JOB} not registed"
    )
    for call in (stub.SubscribeNotifySwitch(ci()), stub.SubscribeNotifyExecStressTest(ci())):
        assert await stream_error(call) == f"jobId={JOB} not registed, please wait agent register"
    assert (await stub.Init(ci())).code == 0 and (await stub.Register(ci())).code == 0
    assert await stream_error(stub.SubscribeSwitchNicSignal(pb.SwitchNicRequest(jobID=JOB))) == (
        f"jobId={JOB} is not swtiching nic"
    )
    assert await stream_error(stub.SubscribeStressTestResponse(pb.StressTestRequest(jobID=JOB))) == (
        f"jobId={JOB} is not stress test"
    )


def status(r) -> tuple[int, str]:
    return r.code, r.info
