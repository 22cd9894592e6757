"""Hot reset on the sim backend (reference deviced.md §6, issue 4): idle gate, 3 resets per chip per
6 h, boot timeout, failure -> SeparateNPU, escalation cleared with the fault; and the --state-file."""

from __future__ import annotations

import asyncio

from support import free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


class Mono:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(sim, *extra):
    args = build_parser().parse_args(
        ["--node-name", "n", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}", "--probe-interval", "0",
         "--hot-reset", "--hot-reset-idle", "60", *extra]
    )  # fmt: skip
    app = DeviceD(args, sim)
    app.monotonic = Mono()
    return app


async def settle(app):
    while app.resetting:
        await asyncio.sleep(0.05)
    await app.run_cycle()


async def test_idle_gate_budget_and_refusal(tmp_path):
    no_rules = tmp_path / "faultCustomization.json"
    no_rules.write_text("{}")  # no frequency rule: only the reset budget limits resets here
    sim = SimBackend(1, 2, reset_boot_s=0.01)
    app = make(sim, "--fault-customization-file", str(no_rules))
    await app.init_backend()
    try:
        for n in range(3):
            sim.devs[1].codes.append(0x80E18008)  # RestartNPU
            sim.set_procs(1, 2)
            app.engine.mark_reinit(1)
            await app.run_cycle()
            assert app.engine.devices[1].health == "UnHealthy"
            app.monotonic.t += 100
            await app.run_cycle()
            assert sim.devs[1].resets == n  # busy: no reset
            sim.set_procs(1, 0)
            await app.run_cycle()  # idle starts now
            app.monotonic.t += 59
            await app.run_cycle()
            assert sim.devs[1].resets == n  # idle 59 s: not yet
            app.monotonic.t += 2
            await app.run_cycle()
            await settle(app)
            assert sim.devs[1].resets == n + 1
            await app.run_cycle()
            assert app.engine.devices[1].health == "Healthy"  # reset cleared the code; re-polled
        # a 4th fault within 6 h: the budget is used, the reset is refused -> SeparateNPU
        sim.devs[1].codes.append(0x80E18008)
        app.engine.mark_reinit(1)
        await app.run_cycle()
        app.monotonic.t += 61
        await app.run_cycle()
        await app.run_cycle()
        assert sim.devs[1].resets == 3
        assert app.state.devices[("NPU", 1)].level == "SeparateNPU"
        # the fault goes away: the escalation goes with it
        sim.devs[1].codes.clear()
        app.engine.mark_reinit(1)
        await app.run_cycle()
        await app.run_cycle()
        assert app.state.devices[("NPU", 1)].health == "Healthy"
    finally:
        await app.tasks.close()
        app.blocking.shutdown()
        app.probe_pool.shutdown()


async def test_boot_timeout_escalates(tmp_path):
    sim = SimBackend(1, 1, reset_boot_s=3600)  # never boots
    app = make(sim, "--hot-reset-idle", "0", "--hot-reset-boot-timeout", "1.5")
    app.monotonic = __import__("time").monotonic
    await app.init_backend()
    try:
        sim.devs[0].codes.append(0x8C084E00)  # FreeRestartNPU
        app.engine.mark_reinit(0)
        await app.run_cycle()
        await app.run_cycle()
        await settle(app)
        assert sim.devs[0].resets == 1
        assert app.state.devices[("NPU", 0)].level == "SeparateNPU"
        assert any(f.code == "HotResetFailed" for f in app.state.faults.values())
    finally:
        await app.tasks.close()
        app.blocking.shutdown()
        app.probe_pool.shutdown()


async def test_state_file_keeps_escalations_across_restart(tmp_path):
    state = tmp_path / "deviced-state.json"
    sim = SimBackend(1, 2)
    app = make(sim, "--state-file", str(state))
    await app.init_backend()
    for _ in range(2):  # 80E18008: 2 in 24 h -> ManuallySeparateNPU (frequency rule)
        sim.devs[0].codes.append(0x80E18008)
        app.engine.mark_reinit(0)
        await app.run_cycle()
        sim.devs[0].codes.clear()
        app.engine.mark_reinit(0)
        await app.run_cycle()
    assert app.state.devices[("NPU", 0)].level == "ManuallySeparateNPU"
    assert state.exists()
    app.blocking.shutdown()
    app.probe_pool.shutdown()

    again = make(SimBackend(1, 2), "--state-file", str(state))
    await again.init_backend()
    await again.run_cycle()
    assert again.state.devices[("NPU", 0)].level == "ManuallySeparateNPU"
    assert again.state.devices[("NPU", 1)].level == ""
    again.blocking.shutdown()
    again.probe_pool.shutdown()
