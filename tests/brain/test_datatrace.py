"""TrainingDataTrace: Modify / Get / Subscribe codes, the profilingSwitch file, agents and FD-OL's hook (§3)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from brain.brainkit import JOB, apply

from clusterd.brain.datatrace import DataTraceError, switch_path
from faultmesh._pb import profiling_pb2 as pb
from faultmesh._pb import profiling_pb2_grpc
from faultmesh.agent import AgentClient


@pytest.fixture
def stub(channel):
    return profiling_pb2_grpc.TrainingDataTraceStub(channel)


def req(name="default/llama", **fields):
    return pb.DataTypeReq(jobNsName=name, profilingSwitch=pb.ProfilingSwitch(**fields))


async def test_modify_get_file_and_codes(cd, stub):
    for bad in ("llama", "a/b/c", "/llama"):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.ModifyTrainingDataTraceSwitch(req(bad))
        assert e.value.details() == "the format of jobNsName is not namespace/jobName"
        r = await stub.GetTrainingDataTraceSwitch(pb.DataStatusReq(jobNsName=bad))
        assert (r.code, r.message) == (300, "the format of jobNsName is not namespace/jobName")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ModifyTrainingDataTraceSwitch(req(Step="on"))
    assert e.value.details() == "notify subscribe failed"  # unknown job
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetTrainingDataTraceSwitch(pb.DataStatusReq(jobNsName="default/llama"))
    assert "failed to found configmap:[default/data-trace-llama]" in e.value.details()
    await apply(cd)
    r = await stub.ModifyTrainingDataTraceSwitch(req(CommunicationOperator="on", Step="on", FP="weird"))
    assert (r.code, r.message) == (200, "successfully changed profiling marker enable status")
    path = switch_path(cd.brain.datatrace.root, "default", "llama")
    assert str(path).endswith("default.data-trace-llama/profilingSwitch")
    assert json.loads(path.read_text()) == {
        "CommunicationOperator": "on",
        "Step": "on",
        "SaveCheckpoint": "",  # omitted fields become ""
        "FP": "weird",  # values are not checked
        "DataLoader": "",
    }
    r = await stub.GetTrainingDataTraceSwitch(pb.DataStatusReq(jobNsName="default/llama"))
    assert (r.code, r.message) == (200, "successfully get the status of job[default/llama]")
    assert (r.profilingSwitch.CommunicationOperator, r.profilingSwitch.FP) == ("on", "weird")
    path.write_text("{not json")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetTrainingDataTraceSwitch(pb.DataStatusReq(jobNsName="default/llama"))
    assert "corrupt" in e.value.details()
    # a new Modify overwrites the corrupt file; the value survives in the state file too
    await stub.ModifyTrainingDataTraceSwitch(req(Step="off"))
    assert json.loads(path.read_text())["Step"] == "off"
    assert (await cd.store.kv_get("datatrace", "default/llama"))["Step"] == "off"


async def test_write_failure_is_500(cd, stub, tmp_path):
    await apply(cd)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    cd.brain.datatrace.root = str(blocker)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ModifyTrainingDataTraceSwitch(req(Step="on"))
    assert "failed to write profilingSwitch" in e.value.details()
    with pytest.raises(DataTraceError) as e2:
        await cd.brain.set_data_trace("default/llama", {"Step": "on"})
    assert e2.value.code == 500 and isinstance(e2.value, OSError)  # FD-OL's hook catches OSError


async def test_subscribe_streams_later_changes_and_replaces(cd, stub):
    call = stub.SubscribeDataTraceSwitch(pb.ProfilingClientInfo(jobId=JOB, role="taskd"))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call.read()
    assert e.value.details() == f"jobId={JOB} not registered"
    await apply(cd)
    await cd.brain.set_data_trace("default/llama", {"Step": "on"})  # before: not sent (no snapshot)
    first = stub.SubscribeDataTraceSwitch(pb.ProfilingClientInfo(jobId=JOB, role="taskd"))
    await asyncio.sleep(0.1)
    # FD-OL's hook: heavy profiling on
    await cd.brain.set_data_trace("default/llama", dict.fromkeys(
        ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader"), "on"
    ))  # fmt: skip
    m = await asyncio.wait_for(first.read(), 5)
    assert (m.code, m.message, m.profilingSwitch.CommunicationOperator, m.profilingSwitch.DataLoader) == (
        200,
        "update profiling switch",
        "on",
        "on",
    )
    second = stub.SubscribeDataTraceSwitch(pb.ProfilingClientInfo(jobId=JOB, role="taskd"))
    await asyncio.sleep(0.1)
    assert await asyncio.wait_for(first.read(), 5) is grpc.aio.EOF  # replaced
    await cd.brain.set_data_trace("default/llama", {"Step": "off"})
    m = await asyncio.wait_for(second.read(), 5)
    assert m.profilingSwitch.Step == "off" and m.profilingSwitch.CommunicationOperator == ""
    second.cancel()


async def test_switch_goes_to_the_jobs_noded(cd):
    await apply(cd)
    got = []

    async def on_control(msg):
        if msg.WhichOneof("body") == "data_trace":
            got.append(msg.data_trace)

    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-b", "noded", on_control=on_control)
    await client.start()
    try:
        await client.wait_synced()
        await cd.brain.set_data_trace("default/llama", {"CommunicationOperator": "off", "Step": "on"})
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.02)
        assert (got[0].job_ns_name, got[0].communication_operator, got[0].step, got[0].fp) == (
            "default/llama",
            "off",
            "on",
            "",
        )
    finally:
        await client.stop()


async def test_a_noded_that_connects_later_gets_the_stored_switch(cd):
    """A switch set while the job's noded was away (restarted, rolled, newly placed) reaches it when it
    connects, so its host file is written (issue 29)."""
    await apply(cd)
    await cd.brain.set_data_trace("default/llama", {"Step": "on", "FP": "off"})
    got = []

    async def on_control(msg):
        if msg.WhichOneof("body") == "data_trace":
            got.append(msg.data_trace)

    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-b", "noded", on_control=on_control)
    await client.start()
    try:
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.02)
        assert (got[0].job_ns_name, got[0].step, got[0].fp) == ("default/llama", "on", "off")
    finally:
        await client.stop()
