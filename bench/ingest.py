"""Ingest benchmark: SendPublicFault req/s and latency (1 and 64 concurrent clients), and agent-stream
deltas/s with 1000 simulated agents, against a real clusterd process on loopback (issue 2).

Run: ``.venv/bin/python bench/ingest.py [--seconds 8] [--agents 1000]``. The last line holds the figures.
clusterd runs with its per-resource and unary limiters opened up, so the server's own cost is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import grpc
import uvloop
from benchkit import Clusterd

from faultmesh._pb import agent_pb2, agent_pb2_grpc, pubfault_pb2, pubfault_pb2_grpc


def request(i: int) -> pubfault_pb2.PublicFaultRequest:
    now = int(time.time() * 1000)
    return pubfault_pb2.PublicFaultRequest(
        id=f"bench-{uuid.uuid4().hex[:12]}",
        timestamp=now,
        version="1.0",
        resource="CCAE",
        faults=[
            pubfault_pb2.Fault(
                faultId=f"f-{i:08d}",
                faultType="NPU",
                faultCode="010001001",
                faultTime=now,
                assertion="occur",
                influence=[pubfault_pb2.PubFaultInfo(nodeName=f"node-{i % 512}", deviceIds=[i % 16])],
            )
        ],
    )


async def pubfault_load(addr: str, concurrency: int, seconds: float) -> tuple[float, float, float]:
    lat: list[float] = []
    counter = [0]
    # one connection per 16 callers: the server allows 64 streams per connection, as the reference
    channels = [
        grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range((concurrency + 15) // 16)
    ]
    stubs = [pubfault_pb2_grpc.PubFaultStub(ch) for ch in channels]
    end = time.perf_counter() + seconds

    async def worker(stub) -> None:
        while time.perf_counter() < end:
            counter[0] += 1
            t = time.perf_counter()
            r = await stub.SendPublicFault(request(counter[0]), timeout=10)
            lat.append(time.perf_counter() - t)
            assert r.code == 0, r

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(stubs[i // 16]) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    for ch in channels:
        await ch.close()
    q = statistics.quantiles(lat, n=100)
    return len(lat) / wall, q[49] * 1000, q[98] * 1000


async def agents_load(addr: str, agents: int, seconds: float) -> tuple[float, float]:
    channels = [
        grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range((agents + 49) // 50)
    ]
    acked = [0]
    lat: list[float] = []
    end = time.perf_counter() + seconds

    async def agent(i: int) -> None:
        call = agent_pb2_grpc.AgentStreamStub(channels[i // 50]).Connect()
        node = f"bench-node-{i:05d}"
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent="noded")))
        await call.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1)))
        await call.read()
        seq = 1
        while time.perf_counter() < end:
            seq += 1
            f = agent_pb2.Fault(
                source="bmc-oem",
                device_type="Memory",
                device_id=seq % 8,
                code=f"{seq % 64:08X}",
                level="SeparateFault",
            )
            t = time.perf_counter()
            await call.write(agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, upserts=[f])))
            msg = await call.read()
            lat.append(time.perf_counter() - t)
            assert msg.ack.seq == seq and not msg.ack.error
            acked[0] += 1
        await call.done_writing()
        call.cancel()

    t0 = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(agents)))
    wall = time.perf_counter() - t0
    for ch in channels:
        await ch.close()
    return acked[0] / wall, statistics.quantiles(lat, n=100)[98] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--agents", type=int, default=1000)
    a = ap.parse_args()
    with Clusterd(
        "--unary-qps", "1000000", "--public-fault-qps", "1000000", "--public-fault-burst", "1000000"
    ) as cd:  # fmt: skip
        grpc_addr = cd.grpc
        r1 = uvloop.run(pubfault_load(grpc_addr, 1, a.seconds))
        print(f"SendPublicFault c=1:  {r1[0]:8.0f} req/s  p50 {r1[1]:.2f} ms  p99 {r1[2]:.2f} ms", flush=True)
        r64 = uvloop.run(pubfault_load(grpc_addr, 64, a.seconds))
        print(
            f"SendPublicFault c=64: {r64[0]:8.0f} req/s  p50 {r64[1]:.2f} ms  p99 {r64[2]:.2f} ms", flush=True
        )
        ag = uvloop.run(agents_load(grpc_addr, a.agents, a.seconds))
        print(
            f"agent stream, {a.agents} agents: {ag[0]:8.0f} deltas/s acked (durable)  ack p99 {ag[1]:.1f} ms"
        )
        print(
            f"RESULT pubfault_c1_rps={r1[0]:.0f} p50_ms={r1[1]:.2f} p99_ms={r1[2]:.2f} "
            f"pubfault_c64_rps={r64[0]:.0f} p50_ms={r64[1]:.2f} p99_ms={r64[2]:.2f} "
            f"agents={a.agents} deltas_per_s={ag[0]:.0f} ack_p99_ms={ag[1]:.1f}"
        )


if __name__ == "__main__":
    main()
