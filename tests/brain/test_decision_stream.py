"""The brain's decision stream (issue 28): a decision is persisted first, then offered to every
subscriber in its own task; a subscriber that raises or stalls delays no decision and loses none."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from clusterd.brain.decisions import NS, DecisionLog
from clusterd.store import Store
from faultmesh.runtime import TaskOwner

N = 300


async def test_stalled_and_raising_subscribers_delay_and_lose_nothing(tmp_path):
    store = Store(tmp_path)
    await store.open()
    tasks = TaskOwner()
    registry = CollectorRegistry()
    dlog = DecisionLog(store, registry, tasks.spawn)
    seen: list[tuple[str, str]] = []
    persisted_when_seen: list[bool] = []
    stalled: list[str] = []
    release = asyncio.Event()
    raised: list[str] = []

    async def recorder(job_id: str, rec: dict) -> None:
        stored = await store.kv_get(NS, job_id, [])
        persisted_when_seen.append(any(r["reason"] == rec["reason"] for r in stored))
        seen.append((job_id, rec["reason"]))

    async def staller(job_id: str, rec: dict) -> None:
        await release.wait()
        stalled.append(rec["reason"])

    def raiser(job_id: str, rec: dict) -> None:
        raised.append(rec["reason"])
        raise RuntimeError("subscriber broke")

    dlog.subscribe(staller, "stall")
    dlog.subscribe(raiser, "raise")
    dlog.subscribe(recorder, "record")
    dlog.start()
    try:
        for i in range(N):
            dlog.record(f"job-{i % 3}", "recover", "stop-train", f"d{i}", "Running")
            if i % 50 == 0:
                await asyncio.sleep(0)  # decisions come from several flows over time
        for _ in range(500):
            if len(seen) == N:
                break
            await asyncio.sleep(0.01)
        # the recording subscriber got every decision, in order, each only once it was stored,
        # while the stalled one still waits on its first
        assert [r for _, r in seen] == [f"d{i}" for i in range(N)]
        assert all(persisted_when_seen)
        assert stalled == []
        assert raised == [f"d{i}" for i in range(N)]  # a raise costs the raiser nothing later
        errors = registry.get_sample_value("faultmesh_sink_errors_total", {"sink": "raise"})
        assert errors == N
        release.set()
        await dlog.close(10.0)
        assert stalled == [f"d{i}" for i in range(N)]
    finally:
        await tasks.close(2.0)
        await store.close()
    # the decisions are in the store after a restart
    store2 = Store(tmp_path)
    await store2.open()
    try:
        again = DecisionLog(store2, CollectorRegistry(), TaskOwner().spawn)
        await again.load()
        assert sum(len(d) for d in again.decisions.values()) == N
    finally:
        await store2.close()


async def test_listeners_lists_subscribers_in_order(tmp_path):
    store = Store(tmp_path)
    dlog = DecisionLog(store, CollectorRegistry(), TaskOwner().spawn)

    def a(job_id, rec): ...
    def b(job_id, rec): ...

    dlog.subscribe(a)
    dlog.subscribe(b)
    assert dlog.listeners == [a, b]
