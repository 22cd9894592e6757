"""End to end: deviced (sim backend) -> clusterd. A relation rule (trigger 8C1F860B + link down
81078603 -> Separate) and a faultDuration.json deadline (the switch L2 link down waits 2 s for a
trigger, then is SubHealth) each change a level seen in clusterd's ``GET /v1/faults``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import ClusterdProcess, free_port, wait_for
from support import http_call as http

BIN = Path(sys.executable).parent


def test_relation_and_deadline_change_levels_in_clusterd(tmp_path):
    sim_port = free_port()
    durations = tmp_path / "faultDuration.json"
    durations.write_text(
        json.dumps(
            [{"FaultCode": "81078603", "FaultType": "faultDevice", "TimeOutInterval": 300},
             {"FaultCode": "[0x08520003,na,L2,na]", "FaultType": "faultSwitch", "TimeOutInterval": 2}]
        )
    )  # fmt: skip
    cd = ClusterdProcess(tmp_path / "state").start()
    log = open(tmp_path / "deviced.log", "wb")  # noqa: SIM115 - closed after the process
    dv = subprocess.Popen(
        [str(BIN / "deviced"), "--node-name", "node-r", "--clusterd", cd.grpc,
         "--backend", "sim", "--sim-control-addr", f"127.0.0.1:{sim_port}", "--http-addr", "127.0.0.1:0",
         "--list-watch-period", "3", "--fault-duration-file", str(durations)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    sim = f"http://127.0.0.1:{sim_port}"

    def faults():
        body = cd.get_json("/v1/faults?node=node-r")
        return {(f["device_type"], f["device_id"], f["code"]): f for f in body}

    try:
        wait_for(lambda: http("GET", f"{sim}/sim/devices")[0] == 200, what="sim api")
        # the deadline: a switch L2 link down with no trigger -> SubHealthFault after 2 s
        body = {"alarm": "08520003", "peer": "L2", "chip": 1, "port": 4, "assertion": "occur"}
        assert http("POST", f"{sim}/sim/switch", body)[0] == 200
        key = ("Switch", 1, "[0x08520003,na,L2,na]")
        first = wait_for(lambda: faults().get(key), what="switch fault in clusterd")
        assert first["level"] == "NotHandle"
        sub = wait_for(
            lambda: (f := faults().get(key)) and f["level"] == "SubHealthFault" and f,
            what="switch relation fault settled",
        )
        assert sub["attributes"]["upgrade"] == "RelationFault"

        # the relation rule: link down on chip 5, then the HCCL trigger on chip 2 -> SeparateNPU
        assert http("POST", f"{sim}/sim/link", {"device": 5, "state": "down"})[0] == 200
        link = ("NPU", 5, "81078603")
        got = wait_for(lambda: faults().get(link), what="link down in clusterd")
        assert got["level"] == "NotHandleFault"
        body = {"device": 2, "code": "8C1F860B", "assertion": "occur"}
        assert http("POST", f"{sim}/sim/fault", body)[0] == 200
        sep = wait_for(
            lambda: (f := faults().get(link)) and f["level"] == "SeparateNPU" and f,
            what="relation escalation in clusterd",
        )
        assert "RelationFault" in sep["attributes"]["upgrade"]
    finally:
        dv.terminate()
        dv.wait(15)
        log.close()
        cd.stop()
