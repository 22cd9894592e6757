"""clusterd confirms a slow card on the first slow round when the node result says its evidence
across steps passed the bound (``seqRanks``, fdol/slownode/sequential.py; issue 34), instead of
after ``nConsecSlowRoundsToConfirm`` (5) rounds; without it the count goes on as before."""

from __future__ import annotations

import asyncio
import time

import orjson
from support import agent_stream, http_call, make_clusterd

from faultmesh._pb import agent_pb2

PLACE = {str(r): "node-a" for r in range(4)}
WAIT_S = 20.0


def _msg(seq: int, job: str, seq_ranks: list[int]) -> agent_pb2.AgentMessage:
    res = {"isSlow": 1, "slowCalculateRanks": [2], "seqRanks": seq_ranks, "slowCommunicationDomains": [],
           "slowSendRanks": [], "slowHostNodes": [], "slowIORanks": [], "suspectRanks": [],
           "lastStep": 40, "baselineReady": True, "degradationLevel": "0.0%"}  # fmt: skip
    body = orjson.dumps({f"slownode_{job}": {"10.0.0.1": res}})
    rep = agent_pb2.SlowNodeReport(job_id=job, node="node-a", result_json=body, timestamp_ms=1)
    return agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, slownode_reports=[rep]))


async def _status(cd, job: str, done) -> dict:
    """The job's status once ``done(status)`` holds, or after ``WAIT_S`` seconds."""
    url = f"http://127.0.0.1:{cd.http.port}/v1/slownode/{job}"
    end = time.monotonic() + WAIT_S
    while True:
        st, body = await asyncio.to_thread(http_call, "GET", url, None)
        if st == 200 and done(body) or time.monotonic() > end:
            return body
        await asyncio.sleep(0.1)


async def test_seq_ranks_confirm_on_the_first_slow_round_plain_rounds_keep_counting(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        for job in ("fast", "plain"):
            conf = {"jobName": job, "jobNamespace": "default", "nSecondsDoOneDetection": 1, "ranks": PLACE}
            st, _ = await asyncio.to_thread(
                http_call, "POST", f"http://127.0.0.1:{cd.http.port}/v1/slownode/jobs", conf
            )
            assert st == 200
        hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-a", agent="noded"))
        snap = agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1))
        await agent_stream(cd.grpc_port, [hello, snap, _msg(2, "fast", [2]), _msg(3, "plain", [])])
        fast = await _status(cd, "fast", lambda b: b["degraded"])
        assert fast["degraded"] and fast["slowRanks"] == [2] and fast["consecutiveSlowRounds"] == 1, fast
        plain = await _status(cd, "plain", lambda b: b["consecutiveSlowRounds"] >= 1)
        assert plain["consecutiveSlowRounds"] == 1 and not plain["degraded"] and not plain["slowRanks"], plain
    finally:
        await cd.stop()
