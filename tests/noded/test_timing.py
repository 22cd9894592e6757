"""noded's timing rules (issue 3 "Timings").

With an injected clock/sleep: BMC poll period (1..600 s), exponential backoff capped at the poll
period and retried forever, one poll per BMC at a time with a timeout that never blocks the loop.
DPC hysteresis (10 min) is in sources/test_storage.py. The agent-stream rules (change reaches
ClusterD within 1 s, at most one report per 5 s under flapping with last state winning, unchanged
state re-sent every 30 min) live in faultmesh.agent.AgentClient, which takes no clock: they are
checked here against a recording fake ClusterD with the intervals scaled down.
"""

from __future__ import annotations

import asyncio
import threading
import time
from importlib import resources

import grpc
import pytest
from noded_support import source_ctx
from prometheus_client import CollectorRegistry
from support import free_port

from faultmesh._pb import agent_pb2, agent_pb2_grpc
from faultmesh.agent import AgentClient, AgentState
from faultmesh.model import Fault
from noded.bmc.client import BmcUnreachable, _NoWaitLock
from noded.bmc.sel import SelEventTable
from noded.levels import LevelTable
from noded.metrics import NodedMetrics
from noded.sources.bmc import COND_UNREACHABLE, Bmc, PollResult


class FakeClient:
    host, port = "bmc.test", 623

    def __init__(self):
        self.lock = threading.Lock()

    def locked(self):
        return _NoWaitLock(self.lock)  # as BmcClient: BmcBusy at once while a call runs

    def drop_session(self):
        pass


class ScriptedPool:
    """Stands in for BlockingPool: each call pops the next outcome (an exception or a PollResult)."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.calls = 0

    async def call(self, timeout_s, fn, *args):
        self.calls += 1
        out = self.outcomes.pop(0) if self.outcomes else PollResult("oem")
        if isinstance(out, Exception):
            raise out
        return out


class Stop(Exception):
    pass


def make_monitor(pool, client=None, poll=60.0, **kw):
    clock = {"t": 0.0}
    sleeps = []

    async def fake_sleep(s):
        sleeps.append(s)
        clock["t"] += s
        if len(sleeps) >= mon.max_sleeps:
            raise Stop()

    mon = Bmc(
        client=client or FakeClient(),
        levels=LevelTable.default,
        sel_table=SelEventTable.from_json(resources.files("noded").joinpath("sel_events.json").read_bytes()),
        metrics=NodedMetrics(CollectorRegistry()),
        poll_interval_s=poll,
        clock=lambda: clock["t"],
        sleep=fake_sleep,
        **kw,
    )
    mon.ctx = source_ctx("bmc", "node-t", pool=pool)
    mon.max_sleeps = 10**9
    mon.fake_clock = clock
    return mon, sleeps


async def test_poll_period_after_success():
    mon, sleeps = make_monitor(ScriptedPool([]), poll=60)
    mon.max_sleeps = 5
    with pytest.raises(Stop):
        await mon.run()
    assert sleeps == [60.0] * 5


async def test_backoff_doubles_to_the_poll_period_and_never_gives_up():
    fails = [BmcUnreachable("down")] * 1000
    pool = ScriptedPool(fails + [PollResult("oem")])
    mon, sleeps = make_monitor(pool, poll=60)
    mon.max_sleeps = 1002
    with pytest.raises(Stop):
        await mon.run()
    assert sleeps[:8] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert set(sleeps[6:1000]) == {60}
    assert pool.calls == 1002  # the reference stops after 3 tries; noded keeps polling
    assert sleeps[1000] == 60 and mon.failures == 0  # back to the poll period after success
    assert mon.state.conditions[COND_UNREACHABLE].active is False


async def test_short_poll_period_caps_the_backoff():
    mon, sleeps = make_monitor(ScriptedPool([BmcUnreachable("x")] * 5), poll=3, backoff_base_s=1.0)
    mon.max_sleeps = 6
    with pytest.raises(Stop):
        await mon.run()
    assert sleeps == [1, 2, 3, 3, 3, 3]


class HangingClient(FakeClient):
    """A BMC call that blocks its thread far longer than the poll timeout (a dead session)."""

    def __init__(self, hang_s):
        super().__init__()
        self.hang_s = hang_s
        self.host = "hung"

    def device_id(self):
        time.sleep(self.hang_s)
        raise BmcUnreachable("gone")


async def test_hung_bmc_times_out_without_blocking_the_loop_and_is_never_queued():
    client = HangingClient(1.5)
    mon = Bmc(
        client=client,
        levels=LevelTable.default,
        sel_table=SelEventTable.from_json(resources.files("noded").joinpath("sel_events.json").read_bytes()),
        metrics=NodedMetrics(CollectorRegistry()),
        poll_interval_s=60,
        timeout_s=0.3,
    )
    mon.ctx = source_ctx("bmc", "node-t")
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    try:
        t0 = time.monotonic()
        assert await mon.poll_once() is False
        assert time.monotonic() - t0 < 1.0
        assert mon.state.conditions[COND_UNREACHABLE].reason == "Timeout"
        assert await mon.poll_once() is False  # the first call still hangs: answered at once, not queued
        assert mon.state.conditions[COND_UNREACHABLE].reason == "Busy"
        assert ticks >= 15  # the event loop kept running while the BMC hung
    finally:
        t.cancel()
        client.lock.acquire(timeout=5)  # let the hung thread finish before the test ends


# -- agent stream timing, against a recording fake ClusterD ------------------------------------------
class RecordingClusterd(agent_pb2_grpc.AgentStreamServicer):
    def __init__(self):
        self.messages: list[tuple[float, str, object]] = []

    async def Connect(self, request_iterator, context):
        async for msg in request_iterator:
            kind = msg.WhichOneof("body")
            # an agent's digest claim (an empty Delta with snapshot_digest) is not a state delta; acked
            # as an older clusterd does (no Ack.digest), the agent then sends its full snapshot
            claim = kind == "delta" and bool(msg.delta.snapshot_digest)
            self.messages.append((time.monotonic(), "claim" if claim else kind, getattr(msg, kind)))
            if kind in ("snapshot", "delta"):
                yield agent_pb2.ControlMessage(ack=agent_pb2.Ack(seq=getattr(msg, kind).seq))

    def of(self, kind):
        return [(t, m) for t, k, m in self.messages if k == kind]


@pytest.fixture
async def fake_clusterd():
    server = grpc.aio.server()
    rec = RecordingClusterd()
    agent_pb2_grpc.add_AgentStreamServicer_to_server(rec, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    rec.target = f"127.0.0.1:{port}"
    yield rec
    await server.stop(0)


def fault(code):
    return Fault("bmc-oem", "node-t", "Memory", 3, code, "PreSeparateFault")


async def _connected(client, rec):
    await client.start()
    await asyncio.wait_for(client.connected.wait(), 10)
    await client.wait_synced(10)


async def test_change_reaches_clusterd_within_one_second(fake_clusterd):
    state = AgentState("node-t")
    client = AgentClient(
        fake_clusterd.target, "node-t", "noded", state=state, min_report_interval_s=5, resend_every_s=1800
    )
    try:
        await _connected(client, fake_clusterd)
        t0 = time.monotonic()
        state.upsert(fault("0800004B"))
        for _ in range(100):
            if fake_clusterd.of("delta"):
                break
            await asyncio.sleep(0.01)
        t, delta = fake_clusterd.of("delta")[0]
        assert t - t0 < 1.0
        assert [f.code for f in delta.upserts] == ["0800004B"]
    finally:
        await client.stop()


async def test_flapping_is_coalesced_and_last_state_wins(fake_clusterd):
    interval = 0.5  # scaled stand-in for the 5 s rule
    state = AgentState("node-t")
    client = AgentClient(
        fake_clusterd.target,
        "node-t",
        "noded",
        state=state,
        min_report_interval_s=interval,
        resend_every_s=1800,
    )
    try:
        await _connected(client, fake_clusterd)
        t_start = time.monotonic()
        for i in range(40):  # flap for 2 s at 20 Hz
            if i % 2 == 0:
                state.upsert(fault("0800004B"))
            else:
                state.remove(fault("0800004B").key)
            await asyncio.sleep(0.05)
        state.upsert(fault("2C000031"))  # the final state
        await client.wait_synced(5)
        deltas = [t for t, _ in fake_clusterd.of("delta") if t >= t_start]
        assert len(deltas) <= 2.5 / interval + 1
        gaps = [b - a for a, b in zip(deltas, deltas[1:], strict=False)]
        assert all(g >= interval * 0.7 for g in gaps), gaps  # receive-side jitter allowance
        # replay every message in order: the last state wins
        view: set[str] = set()
        for _t, kind, m in fake_clusterd.messages:
            if kind == "snapshot":
                view = {f.code for f in m.faults}
            elif kind == "delta":
                view |= {f.code for f in m.upserts}
                view -= {k.code for k in m.removals}
        assert view == set(state_codes(state))
    finally:
        await client.stop()


def state_codes(state):
    return [k.code for k in state.faults]


async def test_unchanged_state_is_resent_periodically(fake_clusterd):
    state = AgentState("node-t")
    state.upsert(fault("0800004B"))
    client = AgentClient(
        fake_clusterd.target, "node-t", "noded", state=state, min_report_interval_s=0, resend_every_s=0.4
    )  # scaled stand-in for 30 min
    try:
        await _connected(client, fake_clusterd)
        await asyncio.sleep(1.5)
        snaps = fake_clusterd.of("snapshot")
        assert 2 <= len(snaps) <= 6
        gaps = [b[0] - a[0] for a, b in zip(snaps, snaps[1:], strict=False)]
        assert all(g >= 0.3 for g in gaps), gaps
        assert all([f.code for f in m.faults] == ["0800004B"] for _, m in snaps)
        assert fake_clusterd.of("delta") == []
    finally:
        await client.stop()


async def test_poll_period_is_a_fixed_rate():
    class SlowPool(ScriptedPool):
        async def call(self, timeout_s, fn, *args):
            mon.fake_clock["t"] += 0.4  # each poll takes 0.4 s of (injected) time
            return await super().call(timeout_s, fn, *args)

    mon, sleeps = make_monitor(SlowPool([]), poll=1.0)
    mon.max_sleeps = 3
    with pytest.raises(Stop):
        await mon.run()
    assert sleeps == pytest.approx([0.6, 0.6, 0.6])
