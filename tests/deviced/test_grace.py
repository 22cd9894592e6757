"""Graceful fault tolerance (issue 32 item 2; reference deviced.md §4.4, §6, the device plugin's
L2 / L3 / L5 flows): deviced (sim backend, its real cycle) against a stand-in of TaskD's fault check
(tests/taskd_faultcheck.py, after the reference's fault_check.py) that stops and starts its
"workers" (the processes on the simulated chips) as the real client does."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

import pytest
from prometheus_client import generate_latest
from support import eventually, free_port
from taskd_faultcheck import FaultCheck, read_reset_info

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend
from deviced.grace import GraceTimers, check_arguments, reset_group_size
from deviced.sinks import deviceinfo
from faultmesh._pb import agent_pb2
from faultmesh.levels import NpuLevel

RESTART_NPU = 0x80E18008  # RestartNPU -> policy reset (L5)
RESTART_REQUEST = 0x80C98002  # RestartRequest -> policy restart_request (L2)
RESTART_BUSINESS = 0x8C204E00  # RestartBusiness -> policy restart (L3)
UBOE_PRESEPARATE = 0x110001024  # a network code, NetworkHealth UnHealthy at once
FAST = GraceTimers(read_cm_s=0.3, device_reset_s=5, self_heal_s=0.2, procs_zero_s=3, error_clean_s=2,
                   npu_ready_s=0.2, poll_s=0.1, refresh_s=10)  # fmt: skip


def make(tmp_path, sim, *extra, grace=None):
    custom = tmp_path / "faultCustomization.json"  # no frequency rule: repeated faults stay at their level
    custom.write_text(json.dumps({"GraceTolerance": grace or {}}))
    args = build_parser().parse_args(
        ["--node-name", "node-a", "--backend", "sim", "--clusterd", f"127.0.0.1:{free_port()}",
         "--probe-interval", "0", "--list-watch-period", "3", "--fault-customization-file", str(custom),
         "--reset-config-dir", str(tmp_path / "reset"), "--grace-reset-group", "2", *extra]
    )  # fmt: skip
    return DeviceD(args, sim)


async def place_job(app, ranks=range(4)):
    job = agent_pb2.JobInfo(
        job_id="j1", name="llama", namespace="ai",
        ranks=[agent_pb2.RankPlacement(rank=r, node="node-a", device_id=r) for r in ranks],
    )  # fmt: skip
    await app.on_control(agent_pb2.ControlMessage(seq=1, job=job))


def workers(sim, chips):
    def start():
        for c in chips:
            sim.set_procs(c, 1)

    def stop():
        for c in chips:
            sim.set_procs(c, 0)

    return start, stop


def doc(folder):
    return json.loads((folder / "reset.json").read_text())


@pytest.fixture
async def grace_app(tmp_path):
    sim = SimBackend(1, 4, reset_boot_s=0.05)
    app = make(tmp_path, sim, "--grace-tolerance")
    app.grace.timers = lambda: FAST
    await app.start()
    await eventually(lambda: app.cycles >= 1, what="first cycle")
    await place_job(app)
    folder = tmp_path / "reset" / "ai.reset-config-llama"
    await eventually(lambda: (folder / "reset.json").exists(), what="the job's reset.json")
    yield app, sim, folder
    await app.stop()


async def test_reset_episode_with_the_taskd_client(grace_app):
    """L5: RestartNPU -> RankList unrecovered / reset, RetryTime + 1 -> the client stops its workers ->
    deviced resets the chip once they are gone -> recovered -> the client restarts them. Twice: each
    episode raises RetryTime by one."""
    app, sim, folder = grace_app
    assert doc(folder) == {**doc(folder), "RankList": [], "RetryTime": 0}  # created empty with the job
    start, stop = workers(sim, range(4))
    client = FaultCheck(folder, [0, 1, 2, 3], start, stop)
    halt = threading.Event()
    runner = threading.Thread(target=client.run, args=(halt, 0.05), daemon=True)
    runner.start()
    try:
        await eventually(lambda: client.running, what="workers started")
        for n in (1, 2):
            sim.inject(2, RESTART_NPU)
            await eventually(lambda n=n: sim.devs[2].resets == n, timeout_s=20, what=f"reset {n}")
            await eventually(
                lambda n=n: app.grace.recovered == n, timeout_s=20, what=f"episode {n} recovered"
            )
            # (the client may restart twice: its retried path empties the RankList it acted on, so its
            # next turn restarts again, as the reference's does)
            await eventually(
                lambda n=n: any(
                    e.startswith("restart") and e.endswith(f"retry_time={n}") for e in client.seen
                ),
                what=f"client restart in episode {n}: {client.seen}",
            )
            d = doc(folder)
            assert d["RetryTime"] == n
            assert [(r["RankId"], r["Status"], r["Policy"], r["InitialPolicy"]) for r in d["RankList"]] == [
                (r, "recovered", "reset", "reset") for r in range(4)
            ]
            assert (folder / "restartType").read_text() == "hotReset"
            assert all(sim.devs[c].procs == 1 for c in range(4))  # training runs again
        assert "stop (unrecovered) retry_time=2" in client.seen
        assert app.grace.failed == 0 and app.state.devices[("NPU", 2)].health == "Healthy"
        scraped = generate_latest(app.registry).decode()
        assert 'faultmesh_deviced_grace_episodes_total{result="recovered"} 2.0' in scraped
    finally:
        halt.set()
        runner.join(5)


async def test_self_healed_fault_is_seen_only_through_retry_time(grace_app):
    """L2: a RestartRequest fault that heals at once: the client, polling every few seconds, sees only
    the end state. The second episode's RankList reads exactly as the first one's, so only
    ``RetryTime > pre_retry_time`` tells it that a retry happened (RetryTime stuck at 0 fails here)."""
    app, sim, folder = grace_app
    start, stop = workers(sim, range(4))
    client = FaultCheck(folder, [0, 1, 2, 3], start, stop)
    assert client.wait_to_start()
    for n in (1, 2):
        sim.inject(1, RESTART_REQUEST)
        await eventually(
            lambda: doc(folder)["RankList"] and doc(folder)["RankList"][1]["Status"] == "unrecovered",
            what=f"episode {n} written",
        )
        assert doc(folder)["RankList"][1]["Policy"] == "restart_request"
        sim.inject(1, RESTART_REQUEST, 0)  # heals before the client looks
        await eventually(lambda n=n: app.grace.recovered == n, timeout_s=20, what=f"episode {n} recovered")
        assert sim.devs[1].resets == 0  # healed: no reset
        before = client.restarts
        client.check()
        client.check()
        assert client.restarts > before, (
            f"TaskD's fault_check saw no device retry in episode {n}: RetryTime "
            f"{doc(folder)['RetryTime']}, last acted on {client.pre_retry_time}; {client.seen}"
        )
    assert "restart (recovered) retry_time=1" in client.seen  # 1st: the RankList changed
    assert "restart (retried) retry_time=2" in client.seen  # 2nd: only RetryTime did
    assert doc(folder)["RetryTime"] == 2


async def test_unhealed_restart_fault_is_upgraded_to_a_reset(grace_app):
    """L3: the processes stop, the self-healing wait passes, the fault is still there -> Policy reset
    (InitialPolicy restart), the chip is reset, then recovered."""
    app, sim, folder = grace_app
    sim.inject(3, RESTART_BUSINESS)
    await eventually(lambda: doc(folder)["RankList"] and doc(folder)["RankList"][3]["Policy"] == "restart",
                     what="L3 written")  # fmt: skip
    await eventually(lambda: doc(folder)["RankList"][3]["Policy"] == "reset", timeout_s=10, what="upgrade")
    assert doc(folder)["RankList"][3]["Status"] == "unrecovered"
    await eventually(lambda: app.grace.recovered == 1, timeout_s=20, what="recovered")
    last = doc(folder)["RankList"][3]
    assert (last["Status"], last["Policy"], last["InitialPolicy"]) == ("recovered", "reset", "restart")
    assert sim.devs[3].resets == 1 and doc(folder)["RetryTime"] == 1


async def test_processes_that_never_stop_isolate_the_job(grace_app):
    """The processes stay on the chips past the wait -> isolate / failed, no reset; the job gets no new
    episode (the writer refuses a RankList after isolate) until its ranks change."""
    app, sim, folder = grace_app
    for c in range(4):
        sim.set_procs(c, 1)  # nobody stops the training
    sim.inject(0, RESTART_NPU)
    await eventually(lambda: app.grace.failed == 1, timeout_s=20, what="episode failed")
    assert [(r["Status"], r["Policy"], r["InitialPolicy"]) for r in doc(folder)["RankList"]] == [
        ("failed", "isolate", "reset")
    ] * 4
    assert sim.devs[0].resets == 0
    sim.inject(1, RESTART_NPU)
    for _ in range(3):
        await app.run_cycle()
    assert app.grace.episodes == 1 and doc(folder)["RetryTime"] == 1
    await place_job(app, ranks=range(3))  # rescheduled: a new placement here, chip 1 still faulty
    await eventually(lambda: app.grace.episodes == 2, what="a new episode for the new placement")
    assert doc(folder)["RetryTime"] == 2 and len(doc(folder)["RankList"]) == 3


async def test_the_reset_budget_is_the_flag(tmp_path):
    """``--hot-reset-budget 1``: the first episode resets chip 2; the second finds the budget used
    (the reference's 3 per 6 h would allow it), writes isolate / failed and separates the chip."""
    sim = SimBackend(1, 4, reset_boot_s=0.05)
    app = make(tmp_path, sim, "--grace-tolerance", "--hot-reset-budget", "1")
    app.grace.timers = lambda: FAST
    await app.start()
    try:
        await eventually(lambda: app.cycles >= 1, what="first cycle")
        await place_job(app)
        folder = tmp_path / "reset" / "ai.reset-config-llama"
        sim.inject(2, RESTART_NPU)
        await eventually(lambda: app.grace.recovered == 1, timeout_s=20, what="episode 1 recovered")
        assert sim.devs[2].resets == 1
        sim.inject(2, RESTART_NPU)
        await eventually(lambda: app.grace.failed == 1, timeout_s=20, what="episode 2 failed")
        assert sim.devs[2].resets == 1  # no second reset
        assert [(r["Status"], r["Policy"]) for r in doc(folder)["RankList"]] == [("failed", "isolate")] * 4
        await eventually(lambda: app.engine.devices[2].level == NpuLevel.SeparateNPU, what="chip 2 separated")
    finally:
        await app.stop()


def device_list(app):
    return json.loads(deviceinfo.build(app)["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"]


async def test_chips_of_a_running_episode_are_shown_healthy(grace_app):
    """Reference ``filterDevStatus``: while the episode runs, the device-info document (what the
    scheduler and kubelet's view read) lists the fault chip as Healthy, its fault record kept; once the
    episode writes isolate, the chip is Unhealthy again. The network of the job's other chips is shown
    Healthy too (the reset group's), here chip 3's UB port fault."""
    app, sim, folder = grace_app
    app.grace.timers = lambda: dataclasses.replace(FAST, procs_zero_s=10)
    sim.set_procs(2, 1)  # the training does not stop: the episode waits, then isolates
    sim.inject(2, RESTART_NPU)
    await eventually(lambda: app.grace.busy, what="episode running")
    sim.inject(3, UBOE_PRESEPARATE)
    await eventually(lambda: app.engine.devices[3].network_health == "UnHealthy", what="chip 3 network")
    assert app.engine.devices[2].health == "UnHealthy"  # the engine (and clusterd) see the fault
    dl = device_list(app)
    assert (dl["huawei.com/Ascend910-Unhealthy"], dl["huawei.com/Ascend910-NetworkUnhealthy"]) == ("", "")
    faults = json.loads(dl["huawei.com/Ascend910-Fault"])
    assert ("Ascend910-2", "80E18008") in [(f["npu_name"], f["fault_code"]) for f in faults]
    await eventually(lambda: app.grace.failed == 1, timeout_s=30, what="episode failed")
    dl = device_list(app)
    assert (dl["huawei.com/Ascend910-Unhealthy"], dl["huawei.com/Ascend910-NetworkUnhealthy"]) == (
        "Ascend910-2",
        "Ascend910-3",
    )


async def test_a_job_smaller_than_a_reset_group_is_left_to_rescheduling(tmp_path, caplog):
    """Reference isReSchedulingScene: on 910B a reset group is 8 chips; a job with 4 chips on the node
    gets no episode (no RetryTime, no reset: the fault goes the rescheduling way), one with 8 does."""
    caplog.set_level(logging.WARNING, logger="deviced.grace")
    sim = SimBackend(1, 8, reset_boot_s=0.05)  # chip 910B3
    app = make(tmp_path, sim, "--grace-tolerance", "--grace-reset-group", "0")  # 0: by product
    app.grace.timers = lambda: FAST
    await app.start()
    try:
        await eventually(lambda: app.cycles >= 1, what="first cycle")
        assert app.grace.group_size() == 8
        await place_job(app, ranks=range(4))
        folder = tmp_path / "reset" / "ai.reset-config-llama"
        await eventually(lambda: (folder / "reset.json").exists(), what="the job's reset.json")
        sim.inject(1, RESTART_NPU)
        await eventually(lambda: "grace tolerance not for job" in caplog.text, what="left-out log")
        assert "4 chips here, a reset group is 8" in caplog.text
        for _ in range(2):
            await app.run_cycle()
        assert app.grace.episodes == 0 and doc(folder)["RetryTime"] == 0 and sim.devs[1].resets == 0
        await place_job(app, ranks=range(8))
        await eventually(lambda: app.grace.episodes == 1, what="an episode for the 8-chip job")
    finally:
        await app.stop()


@pytest.mark.parametrize(
    ("chip", "chips", "group"),
    [("910B3", 8, 8), ("Ascend910B4", 16, 8), ("910_9391", 16, 16), ("910_9392", 8, 8), ("910A", 8, 4),
     ("910ProB", 8, 4), ("310P3", 4, 0), ("H100", 8, 0)],
)  # fmt: skip
def test_reset_group_by_product(chip, chips, group):
    assert reset_group_size(chip, chips) == group


async def test_a_job_that_ends_ends_its_episode(grace_app):
    """The job leaves the node mid-episode: the episode is cancelled, its folder stays removed."""
    app, sim, folder = grace_app
    sim.set_procs(0, 1)  # the episode waits for these processes
    sim.inject(0, RESTART_NPU)
    await eventually(lambda: app.grace.busy, what="episode running")
    await app.on_control(agent_pb2.ControlMessage(seq=2, job=agent_pb2.JobInfo(job_id="j1", deleted=True)))
    await eventually(lambda: not app.grace.busy, what="episode cancelled")
    for _ in range(2):
        await app.run_cycle()
    assert not folder.exists() and sim.devs[0].resets == 0 and app.grace.failed == 0


async def test_timers_come_from_grace_tolerance(tmp_path):
    """The flow's waits are faultCustomization.json's GraceTolerance; the read-CM wait holds the
    episode open after its recovered write (here the table's 5 s, the smallest it allows)."""
    sim = SimBackend(1, 2, reset_boot_s=0.05)
    app = make(tmp_path, sim, "--grace-tolerance",
               grace={"WaitProcessReadCMTime": 5, "WaitDeviceResetTime": 60, "WaitFaultSelfHealingTime": 1})  # fmt: skip
    t = app.grace.timers()
    assert (t.read_cm_s, t.device_reset_s, t.self_heal_s) == (5, 60, 1)
    assert (t.procs_zero_s, t.error_clean_s, t.npu_ready_s) == (60, 30, 30)  # the reference's constants
    app.grace.timers = lambda: dataclasses.replace(GraceTimers.of(app.engine.custom.grace), poll_s=0.1)
    await app.start()
    try:
        await eventually(lambda: app.cycles >= 1, what="first cycle")
        await place_job(app, ranks=range(2))
        folder = tmp_path / "reset" / "ai.reset-config-llama"
        sim.inject(0, RESTART_REQUEST)
        await eventually(lambda: doc(folder)["RetryTime"] == 1, what="episode written")
        sim.inject(0, RESTART_REQUEST, 0)
        await eventually(
            lambda: doc(folder)["RankList"][0]["Status"] == "recovered", timeout_s=10, what="recovered"
        )
        assert app.grace.busy and app.grace.recovered == 0  # still giving TaskD its 5 s to read it
        await eventually(lambda: app.grace.recovered == 1, timeout_s=10, what="episode closed")
    finally:
        await app.stop()


def test_retry_time_is_read_back_after_a_restart(tmp_path):
    """A deviced restart never lowers RetryTime: the job's existing file gives its value."""
    from deviced.sinks.resetcfg import ResetConfigWriter

    folder = tmp_path / "ai.reset-config-llama"
    folder.mkdir()
    (folder / "reset.json").write_text(json.dumps({"RankList": [], "RetryTime": 4}))
    w = ResetConfigWriter(tmp_path, "hotReset", grace=True)
    w.set_job("j1", "llama", "ai", {0: 0}, False)
    assert read_reset_info(folder).retry_time == 4  # kept, not rewritten with 0
    assert w.write_ranks("j1", [{"RankId": 0, "Status": "unrecovered", "Policy": "reset"}], add_retry=True)
    assert read_reset_info(folder).retry_time == 5
    plain = ResetConfigWriter(tmp_path, "podReschedule")  # without grace: the derived file keeps it too
    plain.set_job("j1", "llama", "ai", {0: 0}, False)
    plain.update({})
    assert read_reset_info(folder).retry_time == 5


def test_flags_and_the_unused_grace_tolerance_warning(tmp_path, caplog):
    parser = build_parser()
    for argv, _needle in (
        (["--grace-tolerance"], "needs --reset-config-dir"),
        (["--grace-tolerance", "--reset-config-dir", "d", "--hot-reset"], "exclude each other"),
    ):
        with pytest.raises(SystemExit):
            check_arguments(parser, parser.parse_args(argv))
    caplog.set_level(logging.WARNING, logger="deviced.grace")
    sim = SimBackend(1, 1)
    off = make(tmp_path, sim, grace={"WaitDeviceResetTime": 120})
    assert "GraceTolerance has no effect" in caplog.text and "--grace-tolerance" in caplog.text
    off.io.shutdown()
    caplog.clear()
    on = make(tmp_path, sim, "--grace-tolerance", grace={"WaitDeviceResetTime": 120})
    assert "GraceTolerance" not in caplog.text and on.grace.timers().device_reset_s == 120
    on.io.shutdown()


# -- graceful tolerance excludes process-level recovery (issue 32 item 9): in --grace-tolerance mode
# deviced says so in its Hello, and a job whose JobInfo carries process-level recovery (process-
# recover-enable on, a process-level recover-strategy) gets no grace episode: no RetryTime + 1 for
# TaskD's fault check, no chip reset; clusterd reschedules it at Job level. The same job without
# process recovery gets its episode.


async def place_recovery_job(app, seq: int, **recovery):
    job = agent_pb2.JobInfo(
        job_id="j1", name="llama", namespace="ai",
        ranks=[agent_pb2.RankPlacement(rank=r, node="node-a", device_id=r) for r in range(4)], **recovery,
    )  # fmt: skip
    await app.on_control(agent_pb2.ControlMessage(seq=seq, job=job))


async def test_no_grace_episode_for_a_job_with_process_level_recovery(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="deviced.grace")
    sim = SimBackend(1, 4, reset_boot_s=0.05)
    app = make(tmp_path, sim, "--grace-tolerance")
    app.grace.timers = lambda: FAST
    assert dict(app.agent.hello.labels) == {"graceTolerance": "on"}  # clusterd learns the mode
    await app.start()
    try:
        await eventually(lambda: app.cycles >= 1, what="first cycle")
        await place_recovery_job(app, 1, process_recover_enable="on", recover_strategy=["recover", "dump"])
        folder = tmp_path / "reset" / "ai.reset-config-llama"
        await eventually(lambda: (folder / "reset.json").exists(), what="the job's reset.json")
        sim.inject(2, RESTART_NPU)  # L5: an episode would reset chip 2
        await eventually(lambda: app.grace.excluded == 1, what="the job excluded")
        cycles = app.cycles
        await eventually(lambda: app.cycles >= cycles + 2, what="two more cycles")
        assert app.grace.episodes == 0 and sim.devs[2].resets == 0
        assert (doc(folder)["RetryTime"], doc(folder)["RankList"]) == (0, [])  # fault_check sees nothing
        assert app.state.devices[("NPU", 2)].health == "UnHealthy"  # not hidden: the job is moved
        logged = [r.getMessage() for r in caplog.records if "grace tolerance not for job" in r.getMessage()]
        assert len(logged) == 1 and "fallback=job-rescheduling" in logged[0], logged
        scraped = generate_latest(app.registry).decode()
        assert 'faultmesh_deviced_grace_episodes_total{result="excluded"} 1.0' in scraped

        # process recovery turned off for the job (a new JobInfo): the fault gets its episode now
        await place_recovery_job(app, 2, process_recover_enable="off", recover_strategy=["recover", "dump"])
        await eventually(lambda: doc(folder)["RetryTime"] == 1, what="the grace episode's first write")
        assert app.grace.episodes == 1
        assert {r["Policy"] for r in doc(folder)["RankList"]} == {"reset"}
    finally:
        await app.stop()


async def test_without_grace_tolerance_the_hello_has_no_mode(tmp_path):
    app = make(tmp_path, SimBackend(1, 4))
    assert dict(app.agent.hello.labels) == {}
