"""deviced (sim backend, separate process) reporting to the real clusterd (separate process): faults
injected through the sim control API show up in clusterd's ``GET /v1/faults``, recover, and survive a
clusterd restart (resync by snapshot)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import free_port, http_call, start_logged, stop_proc, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    not (ROOT / "services" / "clusterd" / "app.py").exists(), reason="clusterd not present"
)


start, stop = start_logged, stop_proc


class HTTPError(OSError):
    pass


def http(method: str, url: str, body=None) -> tuple[int, object]:
    status, got = http_call(method, url, body)
    if status == 0:
        raise HTTPError(f"{method} {url}: no answer")
    return status, got


def test_sim_faults_reach_clusterd_and_resync(tmp_path):
    grpc_port, http_port, sim_port = free_port(), free_port(), free_port()
    clusterd_cmd = [
        str(BIN / "clusterd"), "--grpc-addr", f"127.0.0.1:{grpc_port}", "--http-addr", f"127.0.0.1:{http_port}",
        "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    custom = tmp_path / "faultCustomization.json"  # the link-down rule with a 3 s FaultTimeout
    custom.write_text(
        json.dumps(
            {"FaultDuration": [{"EventId": ["81078603"], "FaultTimeout": 3, "RecoverTimeout": 60,
                                "FaultHandling": "PreSeparateNPU"}]}
        )
    )  # fmt: skip
    cd = start(clusterd_cmd, tmp_path / "clusterd.log")
    dv = start(
        [
            str(BIN / "deviced"), "--node-name", "node-7", "--clusterd", f"127.0.0.1:{grpc_port}",
            "--backend", "sim", "--sim-control-addr", f"127.0.0.1:{sim_port}", "--http-addr", "127.0.0.1:0",
            "--list-watch-period", "3", "--fault-customization-file", str(custom),
        ],
        tmp_path / "deviced.log",
    )  # fmt: skip
    sim = f"http://127.0.0.1:{sim_port}"
    api = f"http://127.0.0.1:{http_port}"

    def faults():
        status, body = http("GET", f"{api}/v1/faults")
        if status != 200:
            raise HTTPError(status)
        return {(f["device_id"], f["code"]): f for f in body if f["node"] == "node-7"}

    try:
        wait_for(lambda: http("GET", f"{sim}/sim/devices")[0] == 200, what="sim api")
        assert (
            http("POST", f"{sim}/sim/fault", {"device": 3, "code": "80E18008", "assertion": "occur"})[0]
            == 200
        )
        # deviced's stream is up (its first fault in clusterd) before the link goes down: a link down
        # while deviced still connects reaches clusterd in the snapshot, after its 3 s FaultTimeout
        wait_for(lambda: (3, "80E18008") in faults(), what="deviced's first fault in clusterd")
        cli = subprocess.run(
            [str(BIN / "faultmesh"), "device-sim", "--sim", f"127.0.0.1:{sim_port}", "link", "5", "down"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        status, body = http("POST", f"{sim}/sim/link", {"device": 99, "state": "down"})
        assert status == 400 and "unknown device" in body["error"]
        got = wait_for(
            lambda: (f := faults()) and (3, "80E18008") in f and (5, "81078603") in f and f,
            what="faults in clusterd",
        )
        assert got[(3, "80E18008")]["level"] == "RestartNPU"
        assert got[(3, "80E18008")]["source"] == "dcmi" and got[(3, "80E18008")]["device_type"] == "NPU"
        esc = wait_for(
            lambda: (f := faults().get((5, "81078603"))) and f["level"] == "PreSeparateNPU" and f,
            what="link-down escalation in clusterd",
        )
        assert esc["attributes"]["upgrade"] == "FaultDuration"
        # clusterd's history: NotHandleFault before FaultTimeout, then the escalation (read from the
        # log, not from a poll that a loaded box may make after the 3 s)
        levels = re.findall(
            r"fault changed kind=(\w+) node=node-7 device=NPU-5 code=81078603 level=(\w+)",
            (tmp_path / "clusterd.log").read_text(),
        )
        assert levels[:2] == [("occur", "NotHandleFault"), ("update", "PreSeparateNPU")], levels

        # clusterd restarts: deviced's snapshot on reconnect restores the node's faults
        stop(cd)
        cd = start(clusterd_cmd, tmp_path / "clusterd2.log")
        wait_for(lambda: (3, "80E18008") in faults(), what="resync after clusterd restart")

        assert (
            http("POST", f"{sim}/sim/fault", {"device": 3, "code": "80E18008", "assertion": "recover"})[0]
            == 200
        )
        wait_for(lambda: (3, "80E18008") not in faults(), what="recover in clusterd")
    finally:
        stop(dv)
        stop(cd)
