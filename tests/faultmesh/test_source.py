"""faultmesh.source: the source model every agent source is built on."""

from __future__ import annotations

import asyncio
import logging
import threading

from prometheus_client import CollectorRegistry

from faultmesh.agent import AgentState
from faultmesh.model import Fault
from faultmesh.runtime import BlockingPool
from faultmesh.source import PolledSource, PushSource, SourceContext, Support, start_sources, stop_sources


def fault(code: str, source: str = "fake-poll") -> Fault:
    return Fault(
        source=source, node="n1", device_type="Node", device_id=-1, code=code, level="NotHandleFault"
    )


class FakePolled(PolledSource):
    name = "fake-poll"
    interval_s = 0.05
    timeout_s = 0.2
    backoff_initial_s = 0.01

    def __init__(self, script):
        super().__init__()
        self.script = list(script)
        self.downs: list[str] = []
        self.ups = 0

    async def poll(self):
        step = self.script.pop(0) if self.script else self.last
        self.last = step
        if step == "hang":
            await asyncio.sleep(10)
        if isinstance(step, Exception):
            raise step
        return [fault(c) for c in step]

    def on_down(self, error):
        self.downs.append(error)

    def on_up(self):
        self.ups += 1


def make_ctx(state, registry=None):
    pool = BlockingPool(1)

    def make(src):
        return SourceContext(
            name=src.name, node="n1", state=state, pool=pool, registry=registry or CollectorRegistry()
        )

    return make


async def test_polled_source_raises_recovers_and_logs_transitions_once(caplog):
    state = AgentState("n1")
    reg = CollectorRegistry()
    src = FakePolled([["A"], RuntimeError("bmc gone"), RuntimeError("bmc gone"), "hang", ["B"]])
    caplog.set_level(logging.INFO, "faultmesh.source")
    started = await start_sources([src], make_ctx(state, reg))
    for _ in range(200):
        if src.polls_ok >= 2:
            break
        await asyncio.sleep(0.02)
    await stop_sources(started, budget_s=2)
    assert {k.code for k in state.faults} == {"B"}  # A recovered when B's full set came
    assert src.ups == 2 and len(src.downs) == 1
    down_lines = [r for r in caplog.records if r.getMessage().startswith("source down")]
    assert len(down_lines) == 1 and "bmc gone" in down_lines[0].getMessage()
    assert any(r.getMessage().startswith("source up") for r in caplog.records)
    assert reg.get_sample_value("faultmesh_source_up", {"source": "fake-poll"}) == 1
    assert (
        reg.get_sample_value("faultmesh_source_polls_total", {"source": "fake-poll", "result": "timeout"})
        == 1
    )
    assert (
        reg.get_sample_value("faultmesh_source_polls_total", {"source": "fake-poll", "result": "error"}) == 2
    )


async def test_failed_poll_keeps_the_last_faults():
    state = AgentState("n1")
    src = FakePolled([["A"], RuntimeError("x")])
    started = await start_sources([src], make_ctx(state))
    for _ in range(100):
        if src.failures:
            break
        await asyncio.sleep(0.02)
    await stop_sources(started, budget_s=1)
    assert {k.code for k in state.faults} == {"A"}


class Unsupported(PushSource):
    name = "no-lib"

    def supported(self):
        return Support(False, "libdcmi not found")


class Broken(PushSource):
    name = "broken"

    async def start(self, ctx):
        raise RuntimeError("cannot open")


class Callback(PushSource):
    name = "cb"

    async def start(self, ctx):
        await super().start(ctx)
        self.seen = asyncio.Event()
        ctx.spawn(asyncio.sleep(3600), name="idle")

    def fire_from_c_thread(self):
        t = threading.Thread(target=lambda: self.ctx.from_thread(self._on_event, "80E18008"))
        t.start()
        t.join()

    def _on_event(self, code):
        self.ctx.set_faults([fault(code, self.name)])
        self.seen.set()


async def test_unsupported_and_broken_sources_are_left_out_and_the_rest_run(caplog):
    state = AgentState("n1")
    cb = Callback()
    caplog.set_level(logging.INFO, "faultmesh.source")
    started = await start_sources([Unsupported(), Broken(), cb], make_ctx(state))
    assert [s.name for s, _ in started] == ["cb"]
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("source not supported") and "libdcmi" in m for m in msgs)
    assert any(m.startswith("source not started") and "broken" in m for m in msgs)
    cb.fire_from_c_thread()
    await asyncio.wait_for(cb.seen.wait(), 2)
    assert [k.code for k in state.faults] == ["80E18008"]
    ctx = started[0][1]
    assert len(ctx.tasks) == 1
    await stop_sources(started, budget_s=1)
    assert len(ctx.tasks) == 0
    ctx.from_thread(cb._on_event, "late")  # after stop: dropped, no error


class Stubborn(PushSource):
    name = "stubborn"

    async def stop(self):
        await asyncio.sleep(30)


async def test_stop_sources_keeps_its_budget(caplog):
    started = await start_sources([Stubborn()], make_ctx(AgentState("n1")))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await stop_sources(started, budget_s=0.3)
    assert loop.time() - t0 < 1.5
    assert any(r.getMessage().startswith("source stop overran") for r in caplog.records)
