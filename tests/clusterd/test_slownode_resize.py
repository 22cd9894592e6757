"""A slow-node job that changes size (issue 16 "Bad input"): the job is re-enabled with the new
placement, and a node result still naming ranks that node no longer hosts (computed before the
change reached it) names nobody: it is rejected, counted and logged, while a result for the ranks
the node hosts now is taken."""

from __future__ import annotations

import asyncio
import logging

import grpc
import orjson
from support import agent_stream, http_call, make_clusterd

from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient

OLD = {str(r): ("node-a" if r < 8 else "node-b") for r in range(16)}  # 16 ranks, 8 per node
NEW = {str(r): ("node-a" if r < 4 else "node-b") for r in range(8)}  # shrunk to 8: 4 per node


def conf(ranks: dict) -> dict:
    return {"jobName": "j1", "jobNamespace": "default", "normalNumber": 20, "nSecondsDoOneDetection": 1,
            "cardOneNode": 16, "SlowNode": 1, "ranks": ranks}  # fmt: skip


def result(slow: list[int]) -> dict:
    return {"isSlow": 1 if slow else 0, "slowCalculateRanks": slow, "slowCommunicationDomains": [],
            "slowSendRanks": [], "slowHostNodes": [], "slowIORanks": [], "suspectRanks": [],
            "lastStep": 100, "baselineReady": True}  # fmt: skip


def report(seq: int, slow: list[int]) -> agent_pb2.AgentMessage:
    body = {"slownode_j1": {"10.0.0.1": result(slow)}}
    rep = agent_pb2.SlowNodeReport(job_id="j1", node="node-a", result_json=orjson.dumps(body), timestamp_ms=1)
    return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, slownode_reports=[rep]))


def reports(cd, res: str) -> float:
    return cd.registry.get_sample_value("faultmesh_slownode_reports_total", {"result": res}) or 0.0


def job_recorder(cd, got: list) -> AgentClient:
    """node-a's noded client, appending (job id, enable) of each slownode_job it gets to ``got``."""

    async def on_control(msg):
        if msg.WhichOneof("body") == "slownode_job":
            got.append((msg.slownode_job.job_id, msg.slownode_job.enable))

    return AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-a", "noded", on_control=on_control)


async def call(cd, method: str, path: str, body=None):
    return await asyncio.to_thread(http_call, method, f"http://127.0.0.1:{cd.http.port}{path}", body)


async def test_a_result_for_ranks_of_the_old_size_names_nobody_and_is_counted(tmp_path, caplog):
    cd = await make_clusterd(tmp_path)
    try:
        assert (await call(cd, "POST", "/v1/slownode/jobs", conf(OLD)))[0] == 200
        assert (await call(cd, "POST", "/v1/slownode/jobs", conf(NEW)))[0] == 200
        st, body = await call(cd, "GET", "/v1/slownode/j1")
        assert st == 200 and body["ranks"] == NEW, body
        hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-a", agent="noded"))
        snap = agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1))
        with caplog.at_level(logging.WARNING, logger="clusterd"):
            await agent_stream(cd.grpc_port, [hello, snap, report(2, [6])])  # rank 6: node-b's now
        assert reports(cd, "foreign_rank") == 1
        assert any(
            "slownode report rejected" in r.getMessage() and "6" in r.getMessage() for r in caplog.records
        )
        st, body = await call(cd, "GET", "/v1/slownode/j1")
        assert body["nodeResults"] == {} and not body["slowRanks"], body
        await agent_stream(cd.grpc_port, [hello, agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=3)),
                                          report(4, [2])])  # fmt: skip
        assert reports(cd, "slow") == 1
        st, body = await call(cd, "GET", "/v1/slownode/j1")
        assert body["nodeResults"]["node-a"]["slowCalculateRanks"] == [2], body
    finally:
        await cd.stop()


async def test_a_noded_away_when_a_job_is_disabled_is_told_when_it_is_back(tmp_path):
    """The disable's stop message cannot reach a noded that is reconnecting (a clusterd restart, a
    network blip); it is sent when that noded connects, so the node stops the job (make test saw a
    noded keep running a disabled job after a clusterd restart)."""
    cd = await make_clusterd(tmp_path)
    got: list = []
    try:
        assert (await call(cd, "POST", "/v1/slownode/jobs", conf(NEW)))[0] == 200
        assert (await call(cd, "DELETE", "/v1/slownode/j1"))[0] == 200  # node-a is not connected
        client = job_recorder(cd, got)
        await client.start()
        try:
            async with asyncio.timeout(10):
                while ("j1", False) not in got:
                    await asyncio.sleep(0.02)
            assert ("j1", True) not in got  # the disabled job is not started again
        finally:
            await client.stop()
    finally:
        await cd.stop()


async def test_a_stop_queued_on_a_stream_that_died_unnoticed_reaches_the_nodeds_next_stream(tmp_path):
    """noded's stream is up and acked its snapshot, then goes silent (to clusterd a live stream):
    the job's start and the disable's stop are queued on it and never acked. noded's next stream
    takes it over and gets both, once each, in order, so the node ends with the job stopped (the
    stop was lost before the hub re-queued unacked control messages)."""
    cd = await make_clusterd(tmp_path)
    got: list = []
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            old = agent_pb2_grpc.AgentStreamStub(ch).Connect()
            await old.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-a", agent="noded")))
            await old.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1)))
            assert (await asyncio.wait_for(old.read(), 10)).ack.seq == 1
            assert (await call(cd, "POST", "/v1/slownode/jobs", conf(NEW)))[0] == 200
            assert (await call(cd, "DELETE", "/v1/slownode/j1"))[
                0
            ] == 200  # the stop goes to the silent stream
            client = job_recorder(cd, got)
            await client.start()
            try:
                session = None
                async with asyncio.timeout(10):
                    while session is None or not 0 < session.control_seq == session.acked_control:
                        await asyncio.sleep(0.02)
                        session = cd.agents.sessions.get(("node-a", "noded"))
                assert got == [("j1", True), ("j1", False)]
            finally:
                await client.stop()
    finally:
        await cd.stop()
