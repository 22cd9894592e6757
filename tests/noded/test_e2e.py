"""noded end to end: bmc-sim -> noded -> real clusterd (agent stream), GET /v1/faults, resync."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys

import pytest
from noded_support import BmcSim, free_udp_port
from support import ClusterdProcess, NodedProcess, wait_for


@pytest.fixture
def clusterd(tmp_path):
    cd = ClusterdProcess(tmp_path / "state", extra=["--drain-s", "0.5"]).start()
    yield cd
    cd.stop()


def start_noded(tmp_path, cd, sim, *extra, node="node-a", bmc_port=None):
    return NodedProcess(
        tmp_path,
        node,
        cd.grpc,
        "--bmc-host",
        "127.0.0.1",
        "--bmc-port",
        str(bmc_port or sim.port),
        "--bmc-password-file",
        str(sim.password_file),
        "--bmc-user",
        sim.user,
        "--poll-interval",
        "1",
        "--bmc-timeout",
        "2",
        "--min-report-interval",
        "0.3",
        *extra,
    ).start()


def bmc_faults(cd, node="node-a"):
    return sorted(
        (f["device_type"], f["device_id"], f["code"], f["level"])
        for f in cd.get_json("/v1/faults")
        if f["node"] == node and f["source"].startswith("bmc")
    )


def test_alarm_reaches_clusterd_and_clears(tmp_path, clusterd, bmc_sim):
    nd = start_noded(tmp_path, clusterd, bmc_sim)
    try:
        wait_for(
            lambda: clusterd.get_json("/v1/nodes/node-a").get("node_status") == "Healthy", what="node status"
        )
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        bmc_sim.add_alarm("2C000031", "Disk", 1)
        want = [("Disk", 1, "2C000031", "SeparateFault"), ("Memory", 3, "0800004B", "PreSeparateFault")]
        wait_for(lambda: bmc_faults(clusterd) == want, what="faults in clusterd")
        f = next(f for f in clusterd.get_json("/v1/faults") if f["code"] == "2C000031")
        assert f["source"] == "bmc-oem" and f["assertion"] == "occur" and f["node"] == "node-a"
        assert f["first_seen_ms"] > 0
        assert clusterd.get_json("/v1/nodes/node-a")["node_status"] == "UnHealthy"

        bmc_sim.clear_alarms(code="2C000031")
        wait_for(lambda: bmc_faults(clusterd) == want[1:], what="recovered fault gone")
        assert clusterd.get_json("/v1/nodes/node-a")["node_status"] == "PreSeparate"

        metrics = nd.metrics()
        for name in (
            "faultmesh_noded_bmc_poll_duration_seconds_bucket",
            "faultmesh_noded_bmc_last_success_timestamp_seconds",
            'faultmesh_noded_faults{level="PreSeparateFault",source="bmc-oem"} 1.0',
            "faultmesh_agent_connected 1.0",
        ):
            assert name in metrics
    finally:
        assert nd.stop() == 0


def test_resync_after_clusterd_restart(tmp_path, clusterd, bmc_sim):
    nd = start_noded(tmp_path, clusterd, bmc_sim)
    try:
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        wait_for(
            lambda: bmc_faults(clusterd) == [("Memory", 3, "0800004B", "PreSeparateFault")],
            what="first fault",
        )

        clusterd.stop()  # clusterd down: noded keeps running and keeps the latest state
        bmc_sim.clear_alarms()
        bmc_sim.add_alarm("2C000031", "Disk", 1)
        wait_for(
            lambda: any(f["code"] == "2C000031" for f in nd.get_json("/v1/state")["faults"]),
            what="noded saw the change while clusterd was down",
        )
        assert nd.proc.poll() is None

        clusterd.start()  # same state dir: stale fault must be replaced by the snapshot
        want = [("Disk", 1, "2C000031", "SeparateFault")]
        wait_for(lambda: bmc_faults(clusterd) == want, what="resync after restart")
        assert len([f for f in clusterd.get_json("/v1/faults") if f["code"] == "2C000031"]) == 1

        clusterd.kill9()  # lost state entirely: a fresh clusterd converges from the snapshot
        import shutil

        shutil.rmtree(clusterd.state_dir)
        clusterd.start()
        wait_for(lambda: bmc_faults(clusterd) == want, what="resync into an empty clusterd")
        # the snapshot's faults are committed before its node status is applied (the same message)
        wait_for(
            lambda: clusterd.get_json("/v1/nodes/node-a")["node_status"] == "UnHealthy",
            timeout_s=10,
            what="node status from the snapshot",
        )
    finally:
        nd.stop()


def test_unreachable_bmc_still_reports_node_health(tmp_path, clusterd, bmc_sim):
    nd = start_noded(tmp_path, clusterd, bmc_sim, bmc_port=free_udp_port())
    try:

        def cond():
            view = clusterd.get_json("/v1/nodes/node-a")
            conds = {c["type"]: c for c in view.get("conditions", [])}
            return view.get("node_status") == "Healthy" and conds.get("BMCUnreachable", {}).get("active")

        wait_for(cond, timeout_s=20, what="BMCUnreachable condition in clusterd")
        assert "bmc poll failed" in nd.log_text()
        assert bmc_sim.password not in nd.log_text()
        assert nd.proc.poll() is None
    finally:
        nd.stop()


def test_print_node_info_against_bmc_sim(tmp_path, bmc_sim):
    bmc_sim.add_alarm("0800004B", "Memory", 3)
    bmc_sim.add_alarm("2C000031", "Disk", 1)
    bmc_sim.add_alarm("02000007", "Disk", 1)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "noded",
            "--node-name",
            "node-01",
            "--bmc-host",
            "127.0.0.1",
            "--bmc-port",
            str(bmc_sim.port),
            "--bmc-password-file",
            str(bmc_sim.password_file),
            "--print-node-info",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    info = doc["NodeInfo"]["NodeInfo"]
    inner = json.dumps(info, separators=(",", ":"))
    # the worked example of reference noded.md §4
    assert inner == (
        '{"FaultDevList":[{"DeviceType":"Memory","DeviceId":3,"FaultCode":["0800004B"],'
        '"FaultLevel":"PreSeparateFault"},{"DeviceType":"Disk","DeviceId":1,"FaultCode":["2C000031","02000007"],'
        '"FaultLevel":"SeparateFault"}],"NodeStatus":"UnHealthy"}'
    )
    assert doc["NodeInfo"]["CheckCode"] == "fc0411006f1ec49beb34974f5a412dab379ae57f9cc3ad2f2c7837d0243cbc5c"
    assert doc["NodeInfo"]["CheckCode"] == hashlib.sha256(inner.encode()).hexdigest()
    assert "updateTime" in doc
    assert bmc_sim.password not in out.stderr + out.stdout


def test_print_node_info_with_dead_bmc_fails_clearly(tmp_path):
    sim = BmcSim(tmp_path)  # not started: only its password file is used
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "noded",
            "--node-name",
            "n",
            "--bmc-host",
            "127.0.0.1",
            "--bmc-port",
            str(free_udp_port()),
            "--bmc-password-file",
            str(sim.password_file),
            "--bmc-timeout",
            "1",
            "--print-node-info",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "BMC poll failed" in out.stderr
    assert json.loads(out.stdout)["NodeInfo"]["NodeInfo"] == {"FaultDevList": [], "NodeStatus": "Healthy"}


def test_a_taken_http_port_ends_noded_with_a_clear_line_and_the_launcher_moves_off_it(tmp_path, clusterd):
    """The port :class:`support.NodedProcess` picked is taken before noded binds it (tests run side
    by side): noded exits at once naming the address in use, and the launcher starts it again on
    another free port, logged to the same file."""
    nd = NodedProcess(tmp_path, "node-p", clusterd.grpc)
    taken = nd.http
    host, port = taken.rsplit(":", 1)
    with socket.socket() as s:
        s.bind((host, int(port)))
        s.listen()
        nd.start()
    try:
        assert nd.http != taken
        assert nd.get_json("/v1/state") is not None
        log = nd.log_text()
        assert log.count("noded failed to start") == 1, log
        assert f"('{host}', {port}): address already in use" in log, log
    finally:
        assert nd.stop() == 0
