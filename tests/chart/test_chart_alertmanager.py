"""The Alertmanager inhibitions shipped with the chart (issue 31, files/alertmanager-inhibit.yaml):
``amtool check-config`` accepts them, every alert they name exists in the rules, and a real
Alertmanager mutes the agent, node and clusterd-target alerts while FaultmeshClusterdAbsent fires
(and nothing else, nor another cluster's). Missing tools skip with the install line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from chart.chartkit import CHART
from support import free_port, wait_for, wait_http

INHIBIT = CHART / "files" / "alertmanager-inhibit.yaml"
RULES = CHART / "files" / "prometheus-rules.yaml"


def _config(tmp_path):
    cfg = {
        "route": {"receiver": "null", "group_wait": "1h"},
        "receivers": [{"name": "null"}],
        **yaml.safe_load(INHIBIT.read_text()),
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (apt-get install prometheus-alertmanager)")
    return path


def test_amtool_accepts_the_inhibitions(tmp_path):
    res = subprocess.run(
        [_tool("amtool"), "check-config", str(_config(tmp_path))], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 inhibit rules" in res.stdout


def test_inhibitions_name_alerts_the_rules_fire():
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    muted = set()
    for rule in yaml.safe_load(INHIBIT.read_text())["inhibit_rules"]:
        assert rule["source_matchers"] == ["alertname = FaultmeshClusterdAbsent"]
        name = next(m for m in rule["target_matchers"] if m.startswith("alertname"))
        pattern = name.split("=", 1)[1].strip(' ~"')
        muted |= {a for a in alerts if re.fullmatch(pattern, a)}
    assert "FaultmeshClusterdAbsent" in alerts
    assert {
        "FaultmeshAgentDisconnected",
        "FaultmeshAgentsConnectedDropped",
        "FaultmeshNodeUnhealthy",
        "FaultmeshNodeSubHealthy",
        "FaultmeshSlowNodeConfirmed",
        "FaultmeshTargetDown",
    } <= muted
    assert "FaultmeshStateWriteFailing" not in muted and "FaultmeshBmcUnreachable" not in muted


def _alert(name: str, **labels: str) -> dict:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, **labels},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def test_clusterd_absent_mutes_agent_and_node_alerts(tmp_path):
    exe = _tool("prometheus-alertmanager")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={_config(tmp_path)}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"{base}/-/ready", timeout_s=30)
        sent = [
            _alert("FaultmeshClusterdAbsent", severity="critical", cluster="a"),
            _alert("FaultmeshAgentDisconnected", instance="10.0.0.7:11255", job="agents", cluster="a"),
            _alert("FaultmeshNodeUnhealthy", node="node-1", cluster="a"),
            _alert("FaultmeshTargetDown", job="clusterd", instance="clusterd:8080", cluster="a"),
            _alert("FaultmeshTargetDown", job="noded", instance="10.0.0.7:11255", cluster="a"),
            _alert("FaultmeshBmcUnreachable", instance="10.0.0.7:11256", cluster="a"),
            _alert("FaultmeshNodeUnhealthy", node="node-9", cluster="b"),
        ]
        req = urllib.request.Request(
            f"{base}/api/v2/alerts",
            data=json.dumps(sent).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

        def states():
            with urllib.request.urlopen(f"{base}/api/v2/alerts", timeout=5) as r:
                got = json.loads(r.read())
            if len(got) < len(sent):
                return None
            return {
                (
                    a["labels"]["alertname"],
                    a["labels"].get("node") or a["labels"].get("job", ""),
                    a["labels"]["cluster"],
                ): a["status"]["state"]
                for a in got
            }

        want = {
            ("FaultmeshClusterdAbsent", "", "a"): "active",
            ("FaultmeshAgentDisconnected", "agents", "a"): "suppressed",
            ("FaultmeshNodeUnhealthy", "node-1", "a"): "suppressed",
            ("FaultmeshTargetDown", "clusterd", "a"): "suppressed",
            ("FaultmeshTargetDown", "noded", "a"): "active",
            ("FaultmeshBmcUnreachable", "", "a"): "active",
            ("FaultmeshNodeUnhealthy", "node-9", "b"): "active",
        }
        seen: list = []

        def settled():  # Alertmanager marks inhibited alerts a moment after it lists them
            seen[:] = [states()]
            return seen[0] == want or None

        try:
            wait_for(settled, "the inhibitions applied", timeout_s=20)
        except AssertionError:
            pass
        assert seen[0] == want
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
