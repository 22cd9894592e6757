"""End to end: clusterd + 2 noded processes on one simulated HCCS fabric. A lossy link injected
through the fabric file is detected, localized to the link and shown in GET /v1/faults and
GET /v1/pingmesh; it recovers once the link is healthy; a noded that stops is not a network fault."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from support import ClusterdProcess, free_port, wait_for, wait_http

from fmtools.cli import main as cli_main
from fmtools.sims import fabric as fab

NODES = ["node-0", "node-1"]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture
def stack(tmp_path):
    fabric_file = tmp_path / "fabric.json"
    fab.write_fabric_file(
        fabric_file, {"nodes": NODES, "npus_per_node": 8, "planes": 2, "seed": 5, "faults": []}
    )
    topo_file = tmp_path / "super-pod-0.json"
    topo_file.write_text(json.dumps(fab.Fabric.from_file(fabric_file).sp.to_json_obj()))
    cfg = tmp_path / "pingmesh-config.yaml"
    cfg.write_text('global: \'{"activate":"on","task_interval":1}\'\n')
    cd = ClusterdProcess(
        tmp_path / "state",
        ["--slownet-topology", str(topo_file), "--slownet-config", str(cfg), "--slownet-period-s", "1",
         "--slownet-grace-s", "0.6", "--slownet-suppress-s", "0"],
        log_path=tmp_path / "clusterd.log",
    ).start()  # fmt: skip
    nodeds = {}
    logs = []
    try:
        for n in NODES:
            http = f"127.0.0.1:{free_port()}"
            log = open(tmp_path / f"{n}.log", "wb")
            logs.append(log)
            proc = subprocess.Popen(
                [sys.executable, "-m", "noded", "--node-name", n, "--clusterd", cd.grpc, "--http-addr", http,
                 "--pingmesh-backend", "sim", "--pingmesh-fabric", str(fabric_file),
                 "--pingmesh-dir", str(tmp_path / f"pm-{n}"), "--pingmesh-collect-interval-s", "1",
                 "--min-report-interval", "0"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            nodeds[n] = (proc, http)
            wait_http(f"http://{http}/healthz")
        yield cd, nodeds, fabric_file, tmp_path
    finally:
        for p, _ in nodeds.values():
            if p.poll() is None:
                p.terminate()
                p.wait(15)
        for log in logs:
            log.close()
        cd.stop()


def slownet_faults(cd):
    return [f for f in cd.get_json("/v1/faults") if f["source"] == "slownet"]


def test_lossy_link_detected_localized_and_recovered(stack, capsys):
    cd, nodeds, fabric_file, tmp_path = stack
    # both nodes probe: the matrix fills, no fault on a healthy fabric
    wait_for(lambda: (cd.get_json("/v1/pingmesh")["superPods"][0]["latest"] or {}).get("pathsWithData") == 128,
             what="all 128 paths reporting", timeout_s=30)  # fmt: skip
    assert slownet_faults(cd) == []
    assert (
        fab.main(
            ["inject", str(fabric_file), "lossy_link", "--a", "node-0/2", "--b", "node-1/2", "--loss", "0.5"]
        )
        == 0
    )
    faults = wait_for(lambda: slownet_faults(cd), what="the lossy link as a fault", timeout_s=30)
    assert [(f["node"], f["device_type"], f["device_id"], f["code"], f["level"]) for f in faults] == [
        ("node-0", "NPU", 2, "200001011", "NotHandleFault")
    ]
    alarm = json.loads(faults[0]["attributes"]["alarms"])[0]
    assert (alarm["kind"], alarm["peerNode"], alarm["peerPhyId"], alarm["faultTypeName"]) == (
        "link",
        "node-1",
        2,
        "loss",
    )
    pod = cd.get_json("/v1/pingmesh/0")
    assert [a["kind"] for a in pod["alarms"]] == ["link"] and pod["nodesConnected"] == NODES
    assert cli_main(["pingmesh", "status", "--http", cd.http]) == 1  # alarms found: exit 1
    assert "node-0/npu2 <-> node-1/npu2" in capsys.readouterr().out
    # noded's own view: tasks from the list clusterd pushed (no input files were given to noded)
    node0 = get(f"http://{nodeds['node-0'][1]}/v1/pingmesh")
    assert (
        node0["backend"] == "sim"
        and node0["activate"]
        and len(node0["tasks"]) == 16
        and node0["rowsSent"] > 0
    )
    # result files on the node
    csv = tmp_path / "pm-node-0" / "cluster" / "super-pod-0" / "ping_result_1.csv"
    assert csv.read_text().startswith("pingTaskId,srcType,srcAddr")
    # healthy again -> recovered
    assert fab.main(["clear", str(fabric_file)]) == 0
    wait_for(lambda: slownet_faults(cd) == [], what="recovery", timeout_s=30)
    # a noded that stops reporting is not a network fault
    nodeds["node-1"][0].terminate()
    nodeds["node-1"][0].wait(15)
    time.sleep(4)
    assert slownet_faults(cd) == []
    # the alarm line itself (not only "... alarm recovered"), with where the alarm is
    assert re.search(r"slow network alarm super_pod=\S+ kind=\w+ node=node-", cd.log_text()), cd.log_text()[
        -2000:
    ]
