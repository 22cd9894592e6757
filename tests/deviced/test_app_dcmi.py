"""deviced end to end on the real ctypes binding: the compiled test libdcmi.so / liblingqu-dcmi.so,
callbacks fired from C threads, card drop, subscription fallback, a 100k-callback burst, a hanging
DCMI call, switch faults, reset-config files and hot reset (issue 4 "Done when")."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from native.ctl import Ctl
from support import eventually, free_port

from deviced.app import DeviceD, build_parser
from deviced.backends import DcmiBackend
from faultmesh._pb import agent_pb2


@pytest.fixture
def ctl(native_libs):
    c = Ctl(native_libs)
    c.reset(2, 4)
    c.lq_reset()
    yield c
    c.reset(2, 4)
    c.lq_reset()


def make_app(native_libs, tmp_path, *extra: str) -> DeviceD:
    args = build_parser().parse_args(
        [
            "--node-name", "node-a",
            "--clusterd", f"127.0.0.1:{free_port()}",  # nobody listens: the agent keeps retrying
            "--backend", "dcmi",
            "--dcmi-lib", str(native_libs.dcmi),
            "--lingqu-lib", str(native_libs.lingqu),
            "--http-addr", "127.0.0.1:0",
            "--list-watch-period", "3",
            "--probe-interval", "0.2",
            *extra,
        ]
    )  # fmt: skip
    app = DeviceD(args, DcmiBackend(args.dcmi_lib, args.lingqu_lib))
    app.subscribe_retry_s = 0.01
    return app


def fault_codes(app, source="dcmi"):
    return {(k.device_id, k.code): f.level for k, f in app.state.faults.items() if k.source == source}


@pytest.fixture
async def running(native_libs, tmp_path, ctl, request):
    extra = getattr(request, "param", ())
    ctl.set_phy(5, 13)  # logic 5 is physical chip 13: faults are reported by physical id
    app = make_app(native_libs, tmp_path, *extra)
    await app.start()
    await eventually(lambda: app.cycles >= 1, what="first cycle")
    yield app
    await app.stop()


async def test_callback_from_c_thread_reaches_agent_state(running, ctl):
    app = running
    assert app.subscribed
    assert ctl.fire(5, 0x80E18008, 1, 2, 1, 0) == 0  # logic 5 = card 1 device 1, from a C thread
    await eventually(lambda: (13, "80E18008") in fault_codes(app), what="occur")
    assert fault_codes(app)[(13, "80E18008")] == "RestartNPU"
    f = next(f for f in app.state.faults.values() if f.code == "80E18008")
    assert f.attributes["logic_id"] == "5"
    dev = app.state.devices[("NPU", 5)]  # DeviceState: logic id + phy id
    assert (dev.health, dev.level, dev.phy_id) == ("UnHealthy", "RestartNPU", 13)
    assert ctl.fire(5, 0x80E18008, 0, 2, 1, 0) == 0
    await eventually(lambda: (13, "80E18008") not in fault_codes(app), what="recover")
    assert app.state.devices[("NPU", 5)].health == "Healthy"
    assert app.callbacks == 2 and app.callback_drops == 0


async def test_card_drop_from_health_minus_8012(running, ctl):
    app = running
    ctl.set_rc(b"dcmi_get_device_health", 2, -8012)
    await eventually(lambda: (2, "40F84E00") in fault_codes(app), timeout_s=6, what="card drop")
    assert fault_codes(app)[(2, "40F84E00")] == "RestartNPU"
    ctl.set_rc(b"dcmi_get_device_health", 2, 0)
    await eventually(lambda: (2, "40F84E00") not in fault_codes(app), timeout_s=6, what="card back")


async def test_subscription_failure_falls_back_to_polling(native_libs, tmp_path, ctl):
    ctl.set_rc(b"dcmi_subscribe_fault_event", -1, -8255)
    ctl.set_codes(1, [0x80C98009])
    app = make_app(native_libs, tmp_path)
    await app.start()
    try:
        await eventually(lambda: (1, "80C98009") in fault_codes(app), what="polled code")
        assert not app.subscribed and app.engine.subscribe_failed
        assert ctl.calls(b"dcmi_subscribe_fault_event") == 3
        assert fault_codes(app)[(1, "80C98009")] == "RestartRequest"
        ctl.set_codes(1, [])
        await eventually(lambda: (1, "80C98009") not in fault_codes(app), what="polled recover")
    finally:
        await app.stop()


async def test_burst_of_100k_callbacks_is_bounded_and_state_converges(running, ctl):
    app = running
    t0 = time.monotonic()
    assert ctl.storm_start(200_000, 500, 8, 8, 7) == 0  # 100,000 callbacks from one C thread
    storm = asyncio.ensure_future(asyncio.to_thread(ctl.storm_wait))
    answered = 0
    async with aiohttp.ClientSession() as s:
        while not storm.done():  # the loop keeps answering while the burst runs (bounded, not timed)
            async with s.get(
                f"http://127.0.0.1:{app.http.port}/healthz", timeout=aiohttp.ClientTimeout(10)
            ) as r:
                assert r.status == 200
                answered += 1
            await asyncio.sleep(0.05)
    assert await storm == 100_000
    assert answered >= 1
    await eventually(lambda: app.callbacks == 100_000, timeout_s=30, what="all callbacks seen")
    accepted = 100_000 - app.callback_drops  # token bucket: 1000 burst + 1000/min refill
    assert 1000 <= accepted <= 1000 + (time.monotonic() - t0) * 1000 / 60 + 1

    def converged():
        want = set()
        for logic in range(8):
            phy = app.engine.devices[logic].ids.phy
            want |= {(phy, f"{c:08X}") for c in ctl.live_codes(logic // 4, logic % 4)}
        active = {
            (k.device_id, k.code)
            for k, f in app.state.faults.items()
            if k.source == "dcmi" and "recovered" not in f.attributes
        }
        converged.diff = (sorted(active - want), sorted(want - active))
        return active == want

    try:
        await eventually(converged, timeout_s=30, what="state == last event per (device, code)")
    except AssertionError:
        raise AssertionError(f"extra, missing: {converged.diff}; stats {dict(app.engine.stats)}") from None
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{app.http.port}/metrics") as r:
        text = await r.text()
    assert "faultmesh_deviced_callback_drops_total" in text


@pytest.mark.parametrize("running", [("--probe-interval", "0.2")], indirect=True)
async def test_hanging_probe_call_times_out_and_loop_stays_responsive(running, ctl):
    app = running
    ctl.set_hang(b"dcmi_get_device_network_health", 1500)
    await eventually(
        lambda: app.call_errors[("network_health", "timeout")] >= 1, timeout_s=6, what="probe timeout"
    )
    ctl.set_hang(b"dcmi_get_device_network_health", 0)
    ctl.fire(0, 0x80E18008, 1, 2, 1, 0)
    await eventually(lambda: (0, "80E18008") in fault_codes(app), what="event while probe hung")


async def test_gateway_probe_abnormal_marks_network_fault(running, ctl):
    app = running
    ctl.set_network(3, 3)  # UNREACH
    await eventually(lambda: (3, "181078603") in fault_codes(app), what="probe fault")
    f = next(f for k, f in app.state.faults.items() if k.code == "181078603")
    assert f.level == "NotHandleFault" and f.attributes["signal"] == "gateway-probe"
    assert app.state.devices[("NPU", 3)].network_health == "Healthy"  # < 20 s
    ctl.set_network(3, 6)  # INIT counts as healthy
    await eventually(lambda: (3, "181078603") not in fault_codes(app), what="probe recover")


async def test_switch_faults_graded_from_table(running, ctl):
    app = running
    await eventually(lambda: app.switch_subscribed, what="switch subscription")
    assert ctl.lq_fire(17, 155914, 1, 0, 2, 7, 2, 1, 1) == 0  # [0x00000011,155914,npu,na] unlisted
    assert ctl.lq_fire(0x00F1FEF5, 155914, 1, 0, 2, 7, 2, 1, 1) == 0  # RestartRequest
    await eventually(
        lambda: (2, "[0x00f1fef5,155914,npu,na]") in fault_codes(app, "lingqu"), what="switch fault"
    )
    assert fault_codes(app, "lingqu") == {
        (2, "[0x00f1fef5,155914,npu,na]"): "RestartRequest",
        (2, "[0x00000011,155914,npu,na]"): "NotHandle",  # unlisted: reported, marked unknown
    }
    assert ctl.lq_fire(0x00F1FEF5, 155914, 1, 0, 2, 7, 2, 0, 1) == 0
    assert ctl.lq_fire(17, 155914, 1, 0, 2, 7, 2, 0, 1) == 0
    await eventually(lambda: not fault_codes(app, "lingqu"), what="switch recover")


async def test_reset_config_and_hot_reset(native_libs, tmp_path, ctl):
    rdir = tmp_path / "reset"
    app = make_app(
        native_libs, tmp_path, "--reset-config-dir", str(rdir), "--hot-reset", "--hot-reset-idle", "0.5"
    )
    await app.start()
    try:
        await eventually(lambda: app.cycles >= 1, what="first cycle")
        job = agent_pb2.JobInfo(
            job_id="j1",
            name="llama",
            namespace="ai",
            ranks=[agent_pb2.RankPlacement(rank=r, node="node-a", device_id=r) for r in range(4)]
            + [agent_pb2.RankPlacement(rank=9, node="node-b", device_id=0)],
        )
        await app.on_control(agent_pb2.ControlMessage(seq=1, job=job))
        ctl.set_procs(2, 3)  # busy: no reset yet
        ctl.set_boot(2, 16, 300)
        ctl.fire(2, 0x80E18008, 1, 2, 1, 0)
        path = rdir / "ai.reset-config-llama" / "reset.json"
        await eventually(lambda: path.exists() and "80E18008" in path.read_text(), what="reset.json")
        doc = json.loads(path.read_text())
        assert doc["RankList"] == [
            {
                "RankId": 2, "LogicId": 2, "PhyId": 2, "Status": "unrecovered", "Policy": "reset",
                "InitialPolicy": "reset", "ErrorCode": [], "ErrorCodeHex": "80E18008", "FaultLevel": "RestartNPU",
            }
        ]  # fmt: skip
        assert (path.parent / "restartType").read_text() == "hotReset"
        await asyncio.sleep(1.2)
        assert ctl.resets(2) == 0  # processes still on the chip
        ctl.set_procs(2, 0)
        await eventually(lambda: ctl.resets(2) == 1, timeout_s=8, what="hot reset")
        await eventually(lambda: (2, "80E18008") not in fault_codes(app), timeout_s=8, what="codes re-polled")
        await eventually(
            lambda: json.loads(path.read_text())["RankList"][0]["Status"] == "recovered", what="recovered"
        )
        await app.on_control(
            agent_pb2.ControlMessage(seq=2, job=agent_pb2.JobInfo(job_id="j1", deleted=True))
        )
        assert not path.parent.exists()
    finally:
        await app.stop()


async def test_failed_hot_reset_escalates_to_separate(native_libs, tmp_path, ctl):
    app = make_app(native_libs, tmp_path, "--hot-reset", "--hot-reset-idle", "0")
    ctl.set_rc(b"dcmi_set_device_reset", 6, -1)
    await app.start()
    try:
        ctl.fire(6, 0x80E18008, 1, 2, 1, 0)
        await eventually(
            lambda: (
                app.state.devices.get(("NPU", 6)) is not None
                and app.state.devices[("NPU", 6)].level == "SeparateNPU"
            ),
            what="escalation",
        )
    finally:
        await app.stop()


async def test_missing_library_is_reported_and_retried(native_libs, tmp_path, ctl):
    import shutil

    lib = tmp_path / "driver" / "libdcmi.so"
    args = build_parser().parse_args(
        ["--node-name", "node-a", "--clusterd", f"127.0.0.1:{free_port()}", "--backend", "dcmi",
         "--dcmi-lib", str(lib), "--no-switch", "--probe-interval", "0"]
    )  # fmt: skip
    app = DeviceD(args, None)
    app.init_retry_s = 0.1
    await app.start()
    try:
        await eventually(lambda: "DCMIUnavailable" in app.state.conditions, what="condition")
        cond = app.state.conditions["DCMIUnavailable"]
        assert cond.active and cond.reason == "library missing" and "libdcmi.so" in cond.message
        assert not app.started
        lib.parent.mkdir()
        shutil.copy(native_libs.dcmi, lib)  # the driver gets installed
        await eventually(lambda: app.started and app.cycles >= 1, what="devices after install")
        assert not app.state.conditions["DCMIUnavailable"].active
        assert len(app.state.devices) == 8
    finally:
        await app.stop()


async def test_v2_backend_cycle(native_libs, tmp_path, ctl):
    from deviced.app import make_backend
    from deviced.backends import DcmiV2Backend

    args = build_parser().parse_args(
        ["--node-name", "a5", "--clusterd", f"127.0.0.1:{free_port()}", "--backend", "dcmi", "--dcmi-api", "v2",
         "--dcmi-lib", str(native_libs.dcmi), "--probe-interval", "0"]
    )  # fmt: skip
    backend = make_backend(args)
    assert isinstance(backend, DcmiV2Backend)
    ctl.set_codes(3, [0x81B18603])
    ctl.set_rc(b"dcmi_get_device_health", 5, -8012)
    app = DeviceD(args, backend)
    app.subscribe_retry_s = 0.01
    await app.init_backend()
    try:
        await app.subscribe()
        assert app.subscribed
        await app.run_cycle()
        await app.run_cycle()
        assert fault_codes(app) == {(3, "81B18603"): "NotHandleFault", (5, "40F84E00"): "RestartNPU"}
    finally:
        app.blocking.shutdown()
        app.probe_pool.shutdown()


# -- the fast fault path (issue 18): a callback's fault is reported by a fast cycle at once, not at the
# next one-per-second full cycle; --no-fast-fault-path keeps the reference's cadence.
async def first_report_of(app, ctl, key) -> tuple[int, int]:
    """Fire an occurrence of ``key`` right after a full cycle; return (full cycles, fast cycles) at the
    report that first carried it (counted from that full cycle)."""
    seen: list[tuple[int, int]] = []
    publish = app.cycle.publish

    def spy() -> None:
        publish()
        if key in fault_codes(app) and not seen:
            seen.append((app.cycle.cycles, app.cycle.fast_cycles))

    app.cycle.publish = spy
    c0 = app.cycle.cycles
    app.cycle.wake()
    await eventually(lambda: app.cycle.cycles > c0, what="a full cycle")
    c1, f1 = app.cycle.cycles, app.cycle.fast_cycles
    assert ctl.fire(5, 0x80E18008, 1, 2, 1, 0) == 0
    await eventually(lambda: bool(seen), what="the fault reported")
    return seen[0][0] - c1, seen[0][1] - f1


@pytest.mark.parametrize("fast", [True, False])
async def test_callback_fault_reported_by_fast_cycle(native_libs, tmp_path, ctl, fast):
    ctl.set_phy(5, 13)
    app = make_app(native_libs, tmp_path, *(() if fast else ("--no-fast-fault-path",)))
    await app.start()
    try:
        await eventually(lambda: app.cycles >= 1, what="first cycle")
        full, quick = await first_report_of(app, ctl, (13, "80E18008"))
        if fast:
            assert (full, quick) == (0, 1), "reported before the next full cycle, by one fast cycle"
        else:
            assert (full, quick) == (1, 0), "reported by the next full cycle (reference cadence)"
        assert fault_codes(app)[(13, "80E18008")] == "RestartNPU"
        # the recover stays delayed 1 s (the driver's list lags): a fast cycle does not apply it early
        assert ctl.fire(5, 0x80E18008, 0, 2, 1, 0) == 0
        await asyncio.sleep(0.3)
        assert (13, "80E18008") in fault_codes(app)
        await eventually(lambda: (13, "80E18008") not in fault_codes(app), what="recover")
    finally:
        await app.stop()
