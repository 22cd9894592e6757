"""job.Job (clusterd.md §2.5): codes, limits, first batch and updates."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from brain.brainkit import JOB, apply

from clusterd.brain import jobsvc
from faultmesh._pb import config_pb2_grpc, job_pb2, job_pb2_grpc


@pytest.fixture
def jstub(channel):
    return job_pb2_grpc.JobStub(channel)


@pytest.fixture
def cstub(channel):
    return config_pb2_grpc.ConfigStub(channel)


async def test_job_register_roles_and_limit(cd, jstub, monkeypatch):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await jstub.Register(job_pb2.ClientInfo(role="Hacker"))
    assert "code 400" in e.value.details()
    ids = set()
    for role in jobsvc.ROLES:
        r = await jstub.Register(job_pb2.ClientInfo(role=role))
        assert (r.code, r.info, len(r.clientId)) == (200, "register success", 36)
        ids.add(r.clientId)
    assert len(ids) == 4
    monkeypatch.setattr(jobsvc, "MAX_CLIENTS", 4)
    assert (await jstub.Register(job_pb2.ClientInfo(role="FdAgent"))).code == 429


async def test_subscribe_list_first_batch_then_updates(cd, jstub):
    await apply(cd)
    cid = (await jstub.Register(job_pb2.ClientInfo(role="FdAgent"))).clientId
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await jstub.SubscribeJobSummarySignalList(job_pb2.ClientInfo(role="CCAgent", clientId=cid)).read()
    assert "not registered" in e.value.details()  # role mismatch
    call = jstub.SubscribeJobSummarySignalList(job_pb2.ClientInfo(role="FdAgent", clientId=cid))
    first = await asyncio.wait_for(call.read(), 5)
    assert first.JobTotalNum == 1
    (s,) = first.jobSummarySignals
    assert (s.jobId, s.jobName, s.namespace, s.frameWork, s.jobStatus, s.operator) == (
        JOB,
        "llama",
        "default",
        "pytorch",
        "running",
        "add",
    )
    hccl = json.loads(s.HcclJson)
    assert hccl["server_count"] == "2" and hccl["server_list"][0]["device"][1] == {
        "device_id": "1",
        "rank_id": "1",
    }
    assert not s.deleteTime  # running
    await apply(cd, status="completed")
    upd = await asyncio.wait_for(call.read(), 5)
    assert upd.JobTotalNum == 1 and upd.jobSummarySignals[0].jobStatus == "complete"  # reference spelling
    assert upd.jobSummarySignals[0].operator == "add"  # the reference sends add / delete only
    assert upd.jobSummarySignals[0].deleteTime  # FD-OL stops slow-node detection on it
    await cd.jobs.delete(JOB)
    gone = await asyncio.wait_for(call.read(), 5)
    assert gone.jobSummarySignals[0].operator == "delete" and gone.jobSummarySignals[0].deleteTime
    assert gone.jobSummarySignals[0].jobStatus == "complete"
    call.cancel()


async def test_summary_carries_server_ips_ms_report_time_and_ip_master(cd, jstub):
    cd.nodes.hello("node-a", "10.0.0.1", "SN-A", "boot-a")
    cd.nodes.hello("node-b", "10.0.0.2", "SN-B", "boot-b")
    await apply(cd)
    cid = (await jstub.Register(job_pb2.ClientInfo(role="FdAgent"))).clientId
    call = jstub.SubscribeJobSummarySignalList(job_pb2.ClientInfo(role="FdAgent", clientId=cid))
    first = await asyncio.wait_for(call.read(), 5)
    before_ms = time.time() * 1000
    assert abs(int(first.ReportTime) - before_ms) < 60_000  # milliseconds, not seconds
    (s,) = first.jobSummarySignals
    assert s.masterAddr == "10.0.0.1"  # an IP (pod rank 0's server), not a node name
    servers = json.loads(s.HcclJson)["server_list"]
    assert [(x["server_id"], x["host_ip"], x["server_name"]) for x in servers] == [
        ("10.0.0.1", "10.0.0.1", "node-a"),
        ("10.0.0.2", "10.0.0.2", "node-b"),
    ]
    await cd.jobs.delete(JOB)
    gone = (await asyncio.wait_for(call.read(), 5)).jobSummarySignals[0]
    assert (gone.operator, gone.jobStatus) == ("delete", "failed")  # deleted before it completed
    call.cancel()


async def test_subscribe_single_only_updates_and_per_role_cap(cd, jstub, monkeypatch):
    await apply(cd)
    cid = (await jstub.Register(job_pb2.ClientInfo(role="CCAgent"))).clientId
    call = jstub.SubscribeJobSummarySignal(job_pb2.ClientInfo(role="CCAgent", clientId=cid))
    await asyncio.sleep(0.1)
    await apply(cd, status="failed")
    m = await asyncio.wait_for(call.read(), 5)
    assert (m.jobId, m.jobStatus) == (JOB, "failed")
    monkeypatch.setattr(jobsvc, "MAX_SUBS_PER_ROLE", 1)
    cid2 = (await jstub.Register(job_pb2.ClientInfo(role="CCAgent"))).clientId
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await jstub.SubscribeJobSummarySignal(job_pb2.ClientInfo(role="CCAgent", clientId=cid2)).read()
    assert "more than 1 subscriptions" in e.value.details()
    call.cancel()


async def test_large_job_has_empty_hccl_json(cd, jstub, monkeypatch):
    monkeypatch.setattr(jobsvc, "MAX_RANKS_HCCL", 3)
    await apply(cd)
    cid = (await jstub.Register(job_pb2.ClientInfo(role="DefaultUser1"))).clientId
    call = jstub.SubscribeJobSummarySignalList(job_pb2.ClientInfo(role="DefaultUser1", clientId=cid))
    first = await asyncio.wait_for(call.read(), 5)
    assert first.jobSummarySignals[0].HcclJson == ""
    call.cancel()


# config.Config (MindIE's global rank table): tests/conformance/test_config_service.py


async def test_subscribe_rate_limit(cd, jstub):
    cd.brain.job_svc._limiter = jobsvc.TokenBucket(0.0001, 1)
    cid = (await jstub.Register(job_pb2.ClientInfo(role="DefaultUser2"))).clientId
    first = jstub.SubscribeJobSummarySignal(job_pb2.ClientInfo(role="DefaultUser2", clientId=cid))
    await asyncio.sleep(0.1)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await jstub.SubscribeJobSummarySignalList(
            job_pb2.ClientInfo(role="DefaultUser2", clientId=cid)
        ).read()
    assert "rate limited" in e.value.details()
    first.cancel()


def test_summary_server_ips_prefer_the_pods_host_ip_then_the_nodes():
    """FD-OL reads the servers' addresses from HcclJson ``host_ip`` and ``masterAddr`` (issue 29): the
    pod's ``hostIp`` where the job declares it (as the reference reads the pod), else the node's IP."""
    from clusterd.brain.jobs import parse_job

    reported = {"node-a": "10.0.0.1", "node-b": "10.0.0.2"}
    ranks = [{"rank": 0, "node": "node-a", "deviceId": 0}, {"rank": 1, "node": "node-b", "deviceId": 0}]
    job = parse_job({"id": "job-ip", "name": "ip", "ranks": ranks,
                     "pods": [{"node": "node-a", "podIp": "172.16.0.9", "hostIp": "192.168.9.9"}]})  # fmt: skip
    sig = jobsvc.summary(job, "add", lambda n: reported.get(n, ""))
    table = json.loads(sig.HcclJson)
    assert [(s["server_name"], s["host_ip"], s["server_id"]) for s in table["server_list"]] == [
        ("node-a", "192.168.9.9", "192.168.9.9"),
        ("node-b", "10.0.0.2", "10.0.0.2"),
    ]
    assert sig.masterAddr == "192.168.9.9"
