"""config.Config (MindIE's global rank table) as the reference answers (issue 14 item 6).

Reference: component/clusterd/pkg/application/config/grpc_service.go (Register, SubscribeRankTable,
rankTableChange), publisher.go (ConfigPublisher: 1000-message buffer, ListenDataChange),
pkg/domain/epranktable/ranktable_manager.go (the rate-limited queue: QueueInitDelay 2 s, doubling,
MaxRetryTime 3; GeneratePdDeployModeRankTable), ranktable_util.go (PdDeployModeRankTable, ServerGroup,
PdDeployModeServer, Device JSON shapes; GenerateServerGroup0Or1 / GenerateServerGroup2 /
GenerateServerGroupList), pkg/domain/job/job_storage.go (GetPdDeploymentMode: cross node when a
server job has more than one replica), pkg/common/constant/constants.go (app types, group ids).
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from brain.brainkit import JOB, MINDIE, apply, apply_specs, mindie_specs

from faultmesh._pb import config_pb2, config_pb2_grpc


@pytest.fixture
def cstub(channel):
    return config_pb2_grpc.ConfigStub(channel)


def ci(job: str = MINDIE) -> config_pb2.ClientInfo:
    return config_pb2.ClientInfo(jobId=job, role="mindie-ms-controller")


async def read_table(call, timeout_s: float = 10.0) -> dict:
    m = await asyncio.wait_for(call.read(), timeout_s)
    assert m is not grpc.aio.EOF
    assert m.jobId == MINDIE
    return json.loads(m.rankTable)


async def test_register_and_subscribe_codes(cd, cstub):
    # grpc_service.go SubscribeRankTable: no publisher -> fmt.Errorf("jobId=%s not registered, role=%s")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await cstub.SubscribeRankTable(ci()).read()
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert e.value.details() == f"jobId={MINDIE} not registered, role=mindie-ms-controller"
    # Register: always common.OK (0) "register success", for any job id (known or not)
    r = await cstub.Register(ci())
    assert (r.code, r.info) == (0, "register success")
    assert (await cstub.Register(ci("never-heard-of"))).code == 0
    # the publisher is keyed by job id only: another role reaches the same publisher
    call = cstub.SubscribeRankTable(config_pb2.ClientInfo(jobId=MINDIE, role="other"))
    await apply_specs(cd, mindie_specs())
    assert (await read_table(call))["status"] == "completed"
    call.cancel()


async def test_single_node_global_rank_table_after_the_queue_delay(cd, cstub):
    # every server instance has one pod -> SingleNodePdDeployMode: groups 0 (coordinator),
    # 1 (controller) and 2 (the first server of every instance, with its deploy_server)
    for n, ip in (("node-s0-0", "10.0.1.0"), ("node-s1-0", "10.0.2.0")):
        cd.nodes.hello(n, ip, f"SN-{n}", "boot")
    await apply_specs(cd, mindie_specs())
    await cstub.Register(ci())
    t0 = time.monotonic()
    call = cstub.SubscribeRankTable(ci())
    table = await read_table(call)
    # SubscribeRankTable enqueues with AddRateLimited: the first generation runs after 2 s
    assert time.monotonic() - t0 >= 1.9
    assert list(table) == ["version", "status", "server_group_list"]
    assert (table["version"], table["status"]) == ("1.0", "completed")
    g0, g1, g2 = table["server_group_list"]
    assert g0 == {
        "group_id": "0",
        "server_count": "1",
        "server_list": [{"server_id": "10.0.0.3", "server_ip": "172.16.0.3"}],  # host IP, pod IP
    }
    assert g1["group_id"] == "1" and g1["server_list"] == [
        {"server_id": "10.0.0.4", "server_ip": "172.16.0.4"}
    ]
    assert (g2["group_id"], g2["server_count"]) == ("2", "2")
    first = g2["server_list"][0]
    assert list(first) == ["device", "deploy_server", "server_id", "server_ip"]  # PdDeployModeServer order
    assert first["deploy_server"] == "1" and first["server_id"] == "10.0.1.0"
    assert first["device"] == [
        {"device_id": "0", "device_ip": "192.168.0.0", "device_logical_id": "0", "rank_id": "0"},
        {"device_id": "1", "device_ip": "192.168.0.1", "device_logical_id": "1", "rank_id": "1"},
    ]
    call.cancel()


async def test_cross_node_one_group_per_instance_and_changes_at_once(cd, cstub):
    # an instance with two pods -> CrossNodePdDeployMode: groups 2, 3 (GroupIdOffset 2), one per
    # instance's rank table, with deploy_server and every server
    await apply_specs(cd, mindie_specs(pods_per_server=2))
    await cstub.Register(ci())
    call = cstub.SubscribeRankTable(ci())
    table = await read_table(call)
    groups = table["server_group_list"]
    assert [g["group_id"] for g in groups] == ["0", "1", "2", "3"]
    g2 = groups[2]
    assert list(g2) == ["group_id", "deploy_server", "server_count", "server_list"]
    assert (g2["deploy_server"], g2["server_count"]) == ("2", "2")
    assert [s["server_id"] for s in g2["server_list"]] == ["10.0.1.0", "10.0.1.1"]  # the pods' host IPs
    assert [d["rank_id"] for d in g2["server_list"][1]["device"]] == ["2", "3"]
    assert [d["device_logical_id"] for d in g2["server_list"][1]["device"]] == ["0", "1"]
    # a member changes (the reference's informer handler: Add without delay): a new table at once
    specs = mindie_specs(pods_per_server=2, servers=1)
    await cd.jobs.delete(f"{MINDIE}-server-1")
    await apply_specs(cd, specs)
    async with asyncio.timeout(5):
        while len(table["server_group_list"]) != 3:
            table = await read_table(call, 5)
    call.cancel()


async def test_a_training_job_gets_no_rank_table(cd, cstub):
    # no MindIE server job with this jobID: GetPdDeploymentMode fails, the queue retries and gives up;
    # nothing is sent (before issue 14 faultmesh sent the training job's HCCL table at once)
    await apply(cd)
    await cstub.Register(ci(JOB))
    call = cstub.SubscribeRankTable(ci(JOB))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(call.read(), 2.5)
    call.cancel()


async def test_not_ready_is_retried_four_seconds_later(cd, cstub):
    # the coordinator's pod has no IP yet: GenerateServerGroup0Or1 fails, AddRateLimited retries
    # after 4 s (2 s x 2^1); the pod IP arrives in between
    specs = mindie_specs()
    specs[0]["pods"] = [{"node": "node-c", "podIp": ""}]
    await apply_specs(cd, specs[1:])  # no coordinator job at all yet
    await cstub.Register(ci())
    t0 = time.monotonic()
    call = cstub.SubscribeRankTable(ci())
    await asyncio.sleep(2.5)  # the first try (at 2 s) found no coordinator
    assert cd.registry.get_sample_value(
        "faultmesh_rejected_requests_total", {"service": "brain", "reason": "ranktable_not_ready"}
    )
    specs[0]["pods"] = [{"node": "node-c", "podIp": "172.16.0.3", "hostIp": "10.0.0.3"}]
    await apply_specs(cd, specs[:1])  # a member change: a table at once
    table = await read_table(call)
    assert table["server_group_list"][0]["server_list"] == [
        {"server_id": "10.0.0.3", "server_ip": "172.16.0.3"}
    ]
    assert time.monotonic() - t0 < 6  # from the change, not the retry
    call.cancel()


async def test_register_again_ends_the_old_stream_and_an_ended_stream_drops_the_publisher(cd, cstub):
    await apply_specs(cd, mindie_specs())
    await cstub.Register(ci())
    call = cstub.SubscribeRankTable(ci())
    await read_table(call)
    # Register with a live publisher: publisher.Stop() closes its channel, the old stream ends
    assert (await cstub.Register(ci())).code == 0
    async with asyncio.timeout(5):  # (a table already on its way may still arrive first)
        while (m := await call.read()) is not grpc.aio.EOF:
            assert json.loads(m.rankTable)["status"] == "completed"
    # the new publisher serves a new subscription; when that stream ends the publisher is deleted
    call = cstub.SubscribeRankTable(ci())
    await read_table(call)
    call.cancel()
    async with asyncio.timeout(5):
        while MINDIE in cd.brain.config_svc.pubs:
            await asyncio.sleep(0.02)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await cstub.SubscribeRankTable(ci()).read()
    assert "not registered" in e.value.details()
