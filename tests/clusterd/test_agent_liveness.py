"""Agent liveness (issue 20): a hung (SIGSTOPped) agent is marked stale within ClusterD's
``--agent-stale-after-s`` every time, an agent that died (kill -9) at once; its faults are kept; the
node view (``/v1/nodes``: ``stale_agents`` and an ``AgentStale`` condition), the CLI
(``faultmesh nodes``: DATA column) and ``faultmesh_agent_stale`` say so; it clears when the agent
talks again. Real processes: clusterd and deviced (sim backend)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from support import ClusterdProcess, free_port, wait_for

BIN = Path(sys.executable).parent
STALE_AFTER_S = 2.0
NODE = "node-live"


def http_json(url: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read() or b"null")


def node_view(cd):
    return next((n for n in cd.get_json("/v1/nodes") if n["name"] == NODE), None)


def test_hung_agent_is_marked_stale_within_its_deadline(tmp_path):
    cd = ClusterdProcess(tmp_path / "state", extra=["--agent-stale-after-s", str(STALE_AFTER_S)]).start()
    sim_port = free_port()
    log = open(tmp_path / "deviced.log", "wb")  # noqa: SIM115 - closed below
    dv = subprocess.Popen(
        [
            str(BIN / "deviced"), "--node-name", NODE, "--clusterd", cd.grpc, "--backend", "sim",
            "--sim-control-addr", f"127.0.0.1:{sim_port}", "--http-addr", "127.0.0.1:0",
            "--clusterd-heartbeat-s", "0.5",
        ],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        wait_for(lambda: http_json(f"http://127.0.0.1:{sim_port}/sim/devices"), what="sim api")
        http_json(
            f"http://127.0.0.1:{sim_port}/sim/fault", {"device": 1, "code": "80E18008", "assertion": "occur"}
        )
        wait_for(lambda: (n := node_view(cd)) and n["faults"] == 1, what="fault in clusterd")
        for _ in range(3):
            wait_for(lambda: (n := node_view(cd)) and n["agents"] and not n["stale_agents"], what="live")
            time.sleep(STALE_AFTER_S + 0.5)  # heartbeats keep an idle agent live
            assert node_view(cd)["stale_agents"] == []
            os.kill(dv.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            view = wait_for(
                lambda: (n := node_view(cd)) and n["stale_agents"] and n, what="stale", every_s=0.05
            )
            took = time.monotonic() - t0
            assert took <= STALE_AFTER_S + 0.5, took  # the deadline plus one check period and slack
            assert view["stale_agents"] == ["deviced"] and view["faults"] == 1
            cond = next(c for c in view["conditions"] if c["type"] == "AgentStale")
            assert cond["reason"] == "NoHeartbeat" and cond["active"]
            with urllib.request.urlopen(cd.url("/metrics"), timeout=5) as r:
                assert f'faultmesh_agent_stale{{agent="deviced",node="{NODE}"}} 1.0' in r.read().decode()
            cli = subprocess.run(
                [str(BIN / "faultmesh"), "nodes", "--http", cd.http],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert cli.returncode == 0, cli.stderr
            assert "stale:deviced" in cli.stdout
            os.kill(dv.pid, signal.SIGCONT)
        wait_for(lambda: (n := node_view(cd)) and not n["stale_agents"], what="live again")
        dv.kill()  # kill -9: disconnected, stale at once, faults kept
        dv.wait(10)
        view = wait_for(
            lambda: (n := node_view(cd)) and n["stale_agents"] and n, timeout_s=2, what="stale", every_s=0.05
        )
        assert view["faults"] == 1
        assert next(c for c in view["conditions"] if c["type"] == "AgentStale")["reason"] == "Disconnected"
    finally:
        if dv.poll() is None:
            os.kill(dv.pid, signal.SIGCONT)
            dv.kill()
            dv.wait(10)
        log.close()
        cd.stop()
