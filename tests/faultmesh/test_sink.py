"""faultmesh.sink: a slow consumer delays only itself and converges by resync."""

from __future__ import annotations

import asyncio

from faultmesh.runtime import TaskOwner
from faultmesh.sink import SinkWorker


async def test_batches_arrive_in_order_and_offer_never_waits():
    got: list[int] = []
    w = SinkWorker("fast", lambda b: got.extend(b), maxsize=100)
    tasks = TaskOwner("t")
    tasks.spawn(w.run())
    for i in range(50):
        w.offer([i])
    assert await w.drain(2)
    await tasks.close()
    assert got == list(range(50))


async def test_overflow_drops_the_backlog_and_resyncs_from_a_snapshot():
    truth = {"faults": 0}
    got: list[int] = []
    resyncs: list[dict] = []
    gate = asyncio.Event()

    async def slow(batch):
        await gate.wait()
        got.extend(batch)

    w = SinkWorker("slow", slow, resync=resyncs.append, snapshot=lambda: dict(truth), maxsize=3)
    tasks = TaskOwner("t")
    tasks.spawn(w.run())
    w.offer([0])
    await asyncio.sleep(0.01)  # the worker holds batch 0
    for i in range(1, 10):
        truth["faults"] = i
        w.offer([i])  # never blocks, even with the consumer stuck
    assert w.overflows == 1
    gate.set()
    assert await w.drain(2)
    await tasks.close()
    assert got[0] == 0
    assert resyncs and resyncs[-1] == {"faults": 9}


async def test_a_raising_consumer_keeps_its_worker_alive():
    got = []

    def flaky(batch):
        if batch == ["bad"]:
            raise RuntimeError("boom")
        got.extend(batch)

    w = SinkWorker("flaky", flaky)
    tasks = TaskOwner("t")
    tasks.spawn(w.run())
    w.offer(["bad"])
    w.offer(["good"])
    assert await w.drain(2)
    await tasks.close()
    assert got == ["good"]
