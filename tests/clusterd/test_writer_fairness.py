"""The fault center's writer is fair across agent streams (issue 18): a burst on one stream delays
another stream's next operation by at most one position per stream, never by the whole burst; each
stream's own operations keep their order; a batch stays bounded in rows however much is queued."""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import CollectorRegistry

from clusterd.center import FaultCenter
from clusterd.lanes import FairQueue
from clusterd.store import Store
from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.model import Fault


def _fault(node: str, i: int) -> Fault:
    return Fault("bmc-oem", node, "CPU", i, f"{i:08X}", "SeparateFault")


def test_round_robin_takes_one_item_per_lane_per_turn_and_keeps_each_lane_in_order():
    q: FairQueue[str] = FairQueue()
    for i in range(100):
        q.put(f"burst-{i}", lane="burst")
    q.put("b-0", lane="b")
    q.put("b-1", lane="b")
    q.put("c-0", lane="c")
    got = q.take(6, 1000)
    # the burst came first, yet b's and c's first items leave behind at most one burst item each
    assert got == ["burst-0", "b-0", "c-0", "burst-1", "b-1", "burst-2"]
    rest = q.take(1000, 1000)
    assert rest == [f"burst-{i}" for i in range(3, 100)]
    assert len(q) == 0


def test_a_batch_ends_at_its_row_budget_but_never_splits_or_skips_one_item():
    q: FairQueue[str] = FairQueue()
    q.put("big", lane="a", cost=5000)  # larger than the budget: alone in its batch
    q.put("small", lane="b", cost=10)
    assert q.take(100, 512) == ["big"]
    assert q.take(100, 512) == ["small"]
    for i in range(100):
        q.put(f"x{i}", lane=i % 7, cost=11)
    sizes = []
    while len(q):
        sizes.append(len(q.take(1000, 512)))
    assert sizes == [46, 46, 8]  # 46 * 11 = 506 rows <= 512 < 47 * 11


async def test_a_burst_on_one_stream_delays_another_streams_op_by_one_position(tmp_path):
    store = Store(tmp_path)
    await store.open()
    center = FaultCenter(store, CollectorRegistry(), max_batch=4)
    writer = asyncio.create_task(center.run())
    order: list[str] = []
    try:
        burst = [
            center.submit([_fault("storm", i)], origin="noded", lane=("storm", "noded")) for i in range(200)
        ]
        for i, fut in enumerate(burst):
            fut.add_done_callback(lambda _, i=i: order.append(f"storm-{i}"))
        calm = center.submit([_fault("calm", 1)], origin="noded", lane=("calm", "noded"))
        calm.add_done_callback(lambda _: order.append("calm"))
        await asyncio.wait_for(asyncio.gather(*burst, calm), 20)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await store.close()
    # queued behind 200 ops of the storming stream, the calm stream's op is the second applied
    assert order.index("calm") == 1
    assert [x for x in order if x != "calm"] == [f"storm-{i}" for i in range(200)]


async def test_an_agent_streams_burst_shares_commits_fairly_with_another_stream(cd):
    """Through the agent stream: stream A's 64 deltas are read while a commit is held, then one
    delta of stream B; B's fault is stored in the first commit after the held one, not behind A's
    burst."""
    cd.center._max_batch = 4
    real, commits, release = cd.store.write_faults, [], asyncio.Event()

    async def write(upserts=(), removals=(), marks=None):
        upserts = list(upserts)
        if not commits:
            commits.append(None)
            await release.wait()
        else:
            commits.append({f.node for f, _ in upserts})
        await real(upserts, removals, marks)

    ch = grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}")
    calls = []
    try:
        for node in ("node-a", "node-b"):
            call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
            await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent="noded")))
            await call.write(agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=1)))
            assert (await asyncio.wait_for(call.read(), 10)).ack.seq == 1
            calls.append(call)
        cd.store.write_faults = write
        a, b = calls
        deltas = cd.agents.messages.labels("delta")
        for seq in range(2, 66):
            f = agent_pb2.Fault(
                source="bmc-oem", device_type="CPU", device_id=seq, code="0000AAAA", level="SeparateFault"
            )
            await a.write(agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=seq, upserts=[f])))
        while deltas._value.get() < 64:
            await asyncio.sleep(0.01)
        f = agent_pb2.Fault(
            source="bmc-oem", device_type="CPU", device_id=1, code="0000BBBB", level="SeparateFault"
        )
        await b.write(agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=2, upserts=[f])))
        while deltas._value.get() < 65:
            await asyncio.sleep(0.01)
        release.set()
        ack = await asyncio.wait_for(b.read(), 10)
        assert ack.ack.seq == 2 and not ack.ack.error
        # commit 0 held A's first delta; B's delta is in the next one, beside at most A's next ones
        assert "node-b" in commits[1], commits[:3]
    finally:
        for call in calls:
            call.cancel()
        await ch.close()


async def test_a_replace_counts_the_rows_it_removes_so_a_big_resync_is_a_batch_of_its_own(tmp_path):
    store = Store(tmp_path)
    await store.open()
    center = FaultCenter(store, CollectorRegistry(), max_rows=512)
    writer = asyncio.create_task(center.run())
    real, commits = store.write_faults, []

    async def write(upserts=(), removals=(), marks=None):
        upserts, removals = list(upserts), list(removals)
        commits.append((len(upserts), len(removals)))
        await real(upserts, removals, marks)

    try:
        await center.replace_origin("big", "deviced", [_fault("big", i) for i in range(600)])
        store.write_faults = write
        # an agent restart: its empty snapshot removes the 600 faults its scope holds
        gone = center.submit([], (), ("big", "deviced"), "deviced")
        other = center.submit([_fault("calm", 1)], origin="noded", lane=("calm", "noded"))
        await asyncio.wait_for(asyncio.gather(gone, other), 20)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        await store.close()
    assert commits == [(0, 600), (1, 0)]  # 601 rows: over the budget, the next op waits for its own
