"""Graceful fault tolerance end to end, every part a separate process but the client (issue 32 item
2): clusterd places a job (``POST /v1/jobs``) on deviced's node (sim backend, ``--grace-tolerance``);
the stand-in of TaskD's fault check (tests/taskd_faultcheck.py) reads the job's reset-config folder
and starts / stops its workers through the sim control API, as training processes come and go on
the chips. A RestartNPU fault (L5) and a RestartRequest fault that heals (L2) each make one
episode: the workers stop, restart once every rank reads recovered, and RetryTime counts them."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
from support import free_port, http_call, start_logged, stop_proc, wait_for
from taskd_faultcheck import FaultCheck, read_reset_info

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    not (ROOT / "services" / "clusterd" / "app.py").exists(), reason="clusterd not present"
)


def start_pair(tmp_path, *deviced_extra: str):
    """clusterd and deviced (node-a, sim backend, 2 chips, ``--grace-tolerance``, reset group 2) as
    processes; returns (clusterd proc, deviced proc, deviced's sim API URL, clusterd's HTTP URL)."""
    grpc_port, http_port, sim_port = free_port(), free_port(), free_port()
    cd = start_logged(
        [str(BIN / "clusterd"), "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
         "--state-dir", str(tmp_path / "state")],
        tmp_path / "clusterd.log",
    )  # fmt: skip
    dv = start_logged(
        [str(BIN / "deviced"), "--node-name", "node-a", "--clusterd", f"127.0.0.1:{grpc_port}",
         "--backend", "sim", "--sim-cards", "1", "--sim-devices-per-card", "2", "--grace-reset-group", "2",
         "--sim-control-addr", f"127.0.0.1:{sim_port}", "--http-addr", "127.0.0.1:0",
         "--probe-interval", "0", "--list-watch-period", "3",
         "--reset-config-dir", str(tmp_path / "reset"), "--grace-tolerance", *deviced_extra],
        tmp_path / "deviced.log",
    )  # fmt: skip
    return cd, dv, f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{http_port}"


def test_grace_episodes_through_clusterd_deviced_and_the_taskd_client(tmp_path):
    custom = tmp_path / "faultCustomization.json"  # the smallest waits the table allows; no frequency rule
    custom.write_text(
        json.dumps({"GraceTolerance": {"WaitProcessReadCMTime": 5, "WaitFaultSelfHealingTime": 1}})
    )
    cd, dv, sim, api = start_pair(
        tmp_path, "--fault-customization-file", str(custom), "--grace-npu-ready-s", "0.5"
    )
    folder = tmp_path / "reset" / "ai.reset-config-llama"
    halt = threading.Event()
    runner = None

    def procs(n):
        def set_all():
            for dev in (0, 1):
                assert http_call("POST", f"{sim}/sim/procs", {"device": dev, "count": n})[0] == 200

        return set_all

    def fault(code, assertion):
        assert (
            http_call("POST", f"{sim}/sim/fault", {"device": 1, "code": code, "assertion": assertion})[0]
            == 200
        )

    def restarted(n):
        return any(e.startswith("restart") and e.endswith(f"retry_time={n}") for e in client.seen)

    try:
        wait_for(
            lambda: http_call("GET", f"{sim}/sim/devices")[0] == 200, what="deviced's sim api", timeout_s=30
        )
        job = {"id": "job-1", "name": "llama", "namespace": "ai", "status": "running",
               "ranks": [{"rank": 0, "node": "node-a", "device": 0}, {"rank": 1, "node": "node-a", "device": 1}]}  # fmt: skip
        wait_for(lambda: http_call("POST", f"{api}/v1/jobs", [job])[0] == 200, what="job applied")
        wait_for(lambda: (folder / "reset.json").exists(), what="the job's reset.json from deviced")
        client = FaultCheck(folder, [0, 1], procs(1), procs(0))
        runner = threading.Thread(target=client.run, args=(halt, 0.2), daemon=True)
        runner.start()
        wait_for(lambda: client.running, what="workers started")

        fault("80E18008", "occur")  # RestartNPU: L5
        wait_for(
            lambda: restarted(1), timeout_s=60, what=f"the client's restart after the reset: {client.seen}"
        )
        devs = {d["logic_id"]: d for d in http_call("GET", f"{sim}/sim/devices")[1]}
        assert devs[1]["resets"] == 1 and devs[0]["resets"] == 0
        assert "stop (unrecovered) retry_time=1" in client.seen  # the workers left before the reset
        info = read_reset_info(folder)
        assert info.retry_time == 1 and info.restart_type == "hotReset"
        assert [(r["RankId"], r["Status"], r["Policy"]) for r in info.fault_ranks] == [
            (0, "recovered", "reset"),
            (1, "recovered", "reset"),
        ]

        fault("80C98002", "occur")  # RestartRequest: L2
        wait_for(lambda: read_reset_info(folder).retry_time == 2, what="the L2 episode written")
        fault("80C98002", "recover")  # heals: no reset
        wait_for(
            lambda: restarted(2),
            timeout_s=60,
            what=f"the client's restart after the L2 episode: {client.seen}",
        )
        info = read_reset_info(folder)
        assert [(r["Status"], r["Policy"], r["InitialPolicy"]) for r in info.fault_ranks] == [
            ("recovered", "restart_request", "restart_request")
        ] * 2
        assert {d["logic_id"]: d["resets"] for d in http_call("GET", f"{sim}/sim/devices")[1]} == {0: 0, 1: 1}
        assert all(d["procs"] == 1 for d in http_call("GET", f"{sim}/sim/devices")[1])  # training runs
        # the episode closes after WaitProcessReadCMTime (5 s) for the client to read the last status
        log = wait_for(
            lambda: (
                (t := (tmp_path / "deviced.log").read_text()).count("grace tolerance recovered") == 2 and t
            ),
            what="the second episode closed",
        )
        assert "grace tolerance failed" not in log
    finally:
        halt.set()
        if runner is not None:
            runner.join(5)
        stop_proc(dv)
        stop_proc(cd)


def test_a_process_recovery_job_on_a_grace_node_is_rescheduled_at_job_level(tmp_path):
    """Issue 32 item 9 (the user guide: graceful tolerance and process-level recovery exclude each
    other; such a job is recovered by Job-level rescheduling): the same processes, the job placed
    with process recovery (recover-strategy recover, process-recover-enable on). A RestartNPU fault
    makes no grace episode on deviced (no RetryTime + 1, no reset) and clusterd decides
    job-rescheduling, naming the graceful tolerance of node-a."""
    cd, dv, sim, api = start_pair(tmp_path)
    folder = tmp_path / "reset" / "ai.reset-config-llama"
    try:
        wait_for(
            lambda: http_call("GET", f"{sim}/sim/devices")[0] == 200, what="deviced's sim api", timeout_s=30
        )
        wait_for(
            lambda: (r := http_call("GET", f"{api}/v1/nodes/node-a"))[0] == 200
            and r[1]["labels"] == {"deviced": {"graceTolerance": "on"}},
            what="deviced's graceTolerance label in clusterd",
        )  # fmt: skip
        job = {"id": "job-1", "name": "llama", "namespace": "ai", "status": "running",
               "recover-strategy": "recover", "process-recover-enable": "on",
               "ranks": [{"rank": 0, "node": "node-a", "device": 0}, {"rank": 1, "node": "node-a", "device": 1}]}  # fmt: skip
        wait_for(lambda: http_call("POST", f"{api}/v1/jobs", [job])[0] == 200, what="job applied")
        wait_for(lambda: (folder / "reset.json").exists(), what="the job's reset.json from deviced")
        assert http_call(
            "POST", f"{sim}/sim/fault", {"device": 1, "code": "80E18008", "assertion": "occur"}
        )[0] == 200  # fmt: skip

        def rescheduled():
            recs = http_call("GET", f"{api}/v1/jobs/job-1/recovery")[1]["decisions"]
            return [d for d in recs if d["decision"] == "job-rescheduling"]

        (d,) = wait_for(rescheduled, what="clusterd's job-rescheduling decision")
        assert d["reason"].startswith("graceful tolerance on node node-a excludes process-level recovery")
        log = wait_for(
            lambda: (t := (tmp_path / "deviced.log").read_text()).count("grace tolerance not for job") and t,
            what="deviced leaving the job out",
        )
        assert "fallback=job-rescheduling" in log and "grace tolerance start" not in log
        info = read_reset_info(folder)
        assert (info.retry_time, info.fault_ranks) == (0, [])  # TaskD's fault check sees no episode
        assert all(dev["resets"] == 0 for dev in http_call("GET", f"{sim}/sim/devices")[1])
    finally:
        stop_proc(dv)
        stop_proc(cd)
