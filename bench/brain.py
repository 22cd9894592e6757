"""The brain's latencies: fault -> first signal / stopTrain on the Recover stream, Fault-service fan-out.

1. An in-process ClusterD (all components, state file in a temp folder) with one registered job and
   an in-process trainsim (TaskD stand-in) subscribed to SubscribeProcessManageSignal. For each of
   ``--faults`` rounds an NPU RestartNPU fault enters the fault center (``center.upsert``: the
   clock starts), the brain decides, and the first signal is ``preExitProcess`` (the reference's
   answer to a non-retry hardware fault); the trainsim reports the fault ranks (ReportProcessFault),
   which starts the flow, and the second clock stops when ``stopTrain`` arrives. The trainsim
   answers that with 404 so the controller kills the job and returns to INIT, the fault is removed,
   and the next round starts.
2. ``--subscribers`` SubscribeFaultMsgSignal streams (one registered role each, spread over
   channels of <= 50 streams because of the 64-streams-per-connection limit) on the same job; per
   round a fault appears or clears and the clock stops when every subscriber got its message.

Run: ``.venv/bin/python bench/brain.py [--faults 1000] [--subscribers 500]``. The last line holds
the figures (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import make_clusterd  # noqa: E402

from clusterd.brain.jobs import parse_job  # noqa: E402
from faultmesh._pb import fault_pb2, fault_pb2_grpc  # noqa: E402
from faultmesh.model import Fault  # noqa: E402
from fmtools.trainsim import Outcomes, TrainSim  # noqa: E402

JOB = "bench-job-0001"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def job():
    ranks = [
        {"rank": n * 8 + d, "node": f"node-{n:03d}", "device": d, "superPodId": 0}
        for n in range(16)
        for d in range(8)
    ]
    return parse_job(
        {
            "id": JOB,
            "name": "bench",
            "recover-strategy": "recover",
            "process-recover-enable": "on",
            "ranks": ranks,
        }
    )


async def stop_train_latency(cd, n: int) -> tuple[list[float], list[float]]:
    """(fault -> first signal, fault -> stopTrain) in ms, one of each per round."""
    first = asyncio.Event()
    stop = asyncio.Event()
    killed = asyncio.Event()
    t_first: list[float] = []
    t_stop: list[float] = []

    def on_event(ev):
        if ev["event"] != "signal":
            return
        if not first.is_set():
            t_first.append(time.perf_counter())
            first.set()
        if ev["signalType"] == "stopTrain":
            t_stop.append(time.perf_counter())
            stop.set()
        if ev["signalType"] == "killMaster":
            killed.set()

    sim = TrainSim(f"127.0.0.1:{cd.grpc_port}", JOB, Outcomes(stop="notready"), on_event=on_event)
    ready = asyncio.Event()
    task = asyncio.create_task(sim.run(ready))
    await asyncio.wait_for(ready.wait(), 10)
    await asyncio.sleep(0.2)
    ctl = cd.brain.controllers[JOB]
    out_first, out_stop = [], []
    for i in range(n):
        node = f"node-{i % 16:03d}"
        f = Fault(
            source="deviced",
            node=node,
            device_type="NPU",
            device_id=i % 8,
            code="80E18402",
            level="RestartNPU",
        )
        for ev in (first, stop, killed):
            ev.clear()
        t0 = time.perf_counter()
        await cd.center.upsert(f)
        await asyncio.wait_for(stop.wait(), 10)
        out_first.append((t_first[-1] - t0) * 1000)
        out_stop.append((t_stop[-1] - t0) * 1000)
        await asyncio.wait_for(killed.wait(), 10)
        while ctl.busy():
            await asyncio.sleep(0.0005)
        await cd.center.remove(f.key)
    sim.stop()
    await asyncio.wait_for(task, 10)
    return out_first, out_stop


async def fan_out(cd, subscribers: int, rounds: int) -> list[float]:
    per_channel = 50
    # a local subchannel pool gives each channel its own connection (64 streams per connection)
    opts = [("grpc.use_local_subchannel_pool", 1)]
    n_channels = (subscribers + per_channel - 1) // per_channel
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}", options=opts) for _ in range(n_channels)
    ]
    counts = [0] * subscribers
    done = asyncio.Event()
    target = 0

    async def reader(i: int) -> None:
        stub = fault_pb2_grpc.FaultStub(channels[i // per_channel])
        ci = fault_pb2.ClientInfo(jobId=JOB, role=f"platform-{i}")
        await stub.Register(ci)
        async for _ in stub.SubscribeFaultMsgSignal(ci):
            counts[i] += 1
            if all(c >= target for c in counts):
                done.set()

    tasks = [asyncio.create_task(reader(i)) for i in range(subscribers)]
    while len(cd.brain.fault.pubs) < subscribers:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    f = Fault(
        source="deviced",
        node="node-005",
        device_type="NPU",
        device_id=3,
        code="80818C06",
        level="SubHealthFault",
    )
    out = []
    for r in range(rounds):
        target = r + 1
        done.clear()
        t0 = time.perf_counter()
        if r % 2 == 0:
            await cd.center.upsert(f)
        else:
            await cd.center.remove(f.key)
        await asyncio.wait_for(done.wait(), 30)
        out.append((time.perf_counter() - t0) * 1000)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close()
    return out


async def main(args) -> None:
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        # --pre-exit-wait-s 0: the brain's own latency, not the reference's 10 s wait of an idle
        # controller for TaskD's own report (docs/compatibility.md "The preExit wait")
        cd = await make_clusterd(
            Path(tmp), "--keepalive-s", "5", "--fault-flush-s", "0.01", "--pre-exit-wait-s", "0"
        )
        try:
            await cd.jobs.apply([job()])
            t = time.perf_counter()
            first, lat = await stop_train_latency(cd, args.faults)
            t_lat = time.perf_counter() - t
            print(
                f"fault -> first signal (preExitProcess) over {len(first)} faults: p50 "
                f"{statistics.median(first):.2f} ms, p99 {pct(first, 99):.2f} ms, max {max(first):.2f} ms"
            )
            print(
                f"fault -> stopTrain over {len(lat)} faults: p50 {statistics.median(lat):.2f} ms, "
                f"p99 {pct(lat, 99):.2f} ms, max {max(lat):.2f} ms ({t_lat:.1f} s)"
            )
            # the kill decisions made the job's strategy irrelevant; sub-health is ignored: no flows
            fan = await fan_out(cd, args.subscribers, args.rounds)
            print(
                f"SubscribeFaultMsgSignal fan-out to {args.subscribers} subscribers over {len(fan)} changes: "
                f"p50 {statistics.median(fan):.2f} ms, p99 {pct(fan, 99):.2f} ms"
            )
            print(
                f"RESULT firstsignal_p50_ms={statistics.median(first):.2f} firstsignal_p99_ms={pct(first, 99):.2f} "
                f"stoptrain_p50_ms={statistics.median(lat):.2f} stoptrain_p99_ms={pct(lat, 99):.2f} "
                f"faults={len(lat)} fanout_subscribers={args.subscribers} fanout_p50_ms={statistics.median(fan):.2f} "
                f"fanout_p99_ms={pct(fan, 99):.2f} cpu_count={os.cpu_count()}"
            )
        finally:
            await cd.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=1000)
    p.add_argument("--subscribers", type=int, default=500)
    p.add_argument("--rounds", type=int, default=20)
    uvloop.run(main(p.parse_args()))
