"""Fault-center subscribers run beside the writer, never inside it (issue 12)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from clusterd.center import FaultCenter
from clusterd.store import Store
from faultmesh.model import Fault
from faultmesh.runtime import TaskOwner


def npu(dev: int) -> Fault:
    return Fault(
        source="deviced", node="node-1", device_type="NPU", device_id=dev, code="80E18402", level="RestartNPU"
    )


async def _center(tmp_path):
    store = Store(tmp_path)
    await store.open()
    center = FaultCenter(store, CollectorRegistry())
    tasks = TaskOwner("test")
    tasks.spawn(center.run(), name="writer")
    return store, center, tasks


async def test_a_stuck_subscriber_does_not_stall_durable_ingest(tmp_path):
    store, center, tasks = await _center(tmp_path)
    release = asyncio.Event()
    seen: list[int] = []

    async def stuck(changes) -> None:
        await release.wait()
        seen.extend(c.fault.device_id for c in changes)

    center.subscribe("stuck", stuck)
    center.start_sinks(tasks.spawn)
    try:
        async with asyncio.timeout(5):
            for d in range(20):
                await center.upsert(npu(d))  # durable and acked although the subscriber hangs
        assert len(center) == 20 and seen == []
        release.set()
        assert await center.drain_sinks(5)
        assert seen == list(range(20))  # commit order
    finally:
        await center.stop_sinks()
        await tasks.close()
        await store.close()


async def test_overflow_resyncs_from_a_snapshot(tmp_path):
    store, center, tasks = await _center(tmp_path)
    release = asyncio.Event()
    batches: list[int] = []
    resyncs: list[int] = []

    async def slow(changes) -> None:
        await release.wait()
        batches.append(len(changes))

    worker = center.subscribe("slow", slow, maxsize=2, resync=lambda faults: resyncs.append(len(faults)))
    center.start_sinks(tasks.spawn)
    try:
        for d in range(10):
            await center.upsert(npu(d))
        release.set()
        assert await center.drain_sinks(5)
        assert worker.overflows >= 1
        assert resyncs and resyncs[-1] == 10  # caught up with the whole current state
    finally:
        await center.stop_sinks()
        await tasks.close()
        await store.close()
