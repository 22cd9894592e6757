"""Node identity (issue 29): ``--node-ip`` (env ``NODE_IP``, else the older ``XDL_IP``) on noded and
deviced goes in the Hello and shows in clusterd's ``/v1/nodes``; a value that is not an IP address is
a usage error naming the flag; two agents of one node giving different IPs: the later one wins, and
the change is logged (``node ip changed old=... new=...``) and counted
(``faultmesh_node_ip_changes_total``). Real processes on loopback, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from support import ClusterdProcess, stop_proc, wait_for

from faultmesh import config
from noded.app import build_parser as noded_parser

ENV = {k: v for k, v in os.environ.items() if k not in ("NODE_IP", "XDL_IP", "FAULTMESH_NODE_IP")}


def _agent(module: str, *args: str, env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "wb") if log else subprocess.PIPE  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=out,
        stderr=subprocess.STDOUT if log else subprocess.PIPE,
        env={**ENV, "PYTHONUNBUFFERED": "1", **(env or {})},
        text=log is None,
    )


def test_a_node_ip_that_is_not_an_ip_is_a_usage_error_naming_the_flag():
    runs = [
        _agent("noded", "--node-name", "n1", "--node-ip", "10.0.0"),
        _agent("deviced", "--node-name", "n1", "--backend", "sim", env={"NODE_IP": "host-1.example"}),
        _agent("noded", "--node-name", "n1", env={"XDL_IP": "not-an-ip"}),
    ]
    for p, bad in zip(runs, ("10.0.0", "host-1.example", "not-an-ip"), strict=True):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2, err
        assert f"argument --node-ip: {bad!r} is not an IP address" in err


def test_an_unspecified_or_multicast_node_ip_is_a_usage_error(capsys):
    """``0.0.0.0`` (a listen address copied into --node-ip / NODE_IP) would go into the job summary's
    host_ip where FD-OL and the training side dial it: refused at start as a non-IP is."""
    for bad, what in (("0.0.0.0", "the unspecified address"), ("::", "the unspecified address"),
                      ("224.0.0.1", "a multicast address")):  # fmt: skip
        try:
            noded_parser().parse_args(["--node-name", "n", "--node-ip", bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"--node-ip {bad} taken")
        assert f"argument --node-ip: {bad!r} is {what}, not a node's" in capsys.readouterr().err


def test_node_ip_from_flag_env_and_the_older_xdl_ip(monkeypatch):
    monkeypatch.delenv("NODE_IP", raising=False)
    monkeypatch.delenv("FAULTMESH_NODE_IP", raising=False)
    monkeypatch.setenv("XDL_IP", "10.0.0.9")
    assert config.parse(noded_parser(), ["--node-name", "n"]).node_ip == "10.0.0.9"
    monkeypatch.setenv("NODE_IP", "fd00:0::1")  # NODE_IP first; an IPv6 address in its short form
    assert config.parse(noded_parser(), ["--node-name", "n"]).node_ip == "fd00::1"
    assert config.parse(noded_parser(), ["--node-name", "n", "--node-ip", "10.1.1.1"]).node_ip == "10.1.1.1"
    monkeypatch.delenv("NODE_IP")
    monkeypatch.delenv("XDL_IP")
    assert config.parse(noded_parser(), ["--node-name", "n"]).node_ip is None


def test_nodes_show_their_ip_and_the_later_agent_wins(tmp_path):
    cd = ClusterdProcess(tmp_path / "state").start()
    agents: list[subprocess.Popen] = []
    try:
        common = ["--clusterd", cd.grpc, "--http-addr", "127.0.0.1:0"]
        agents.append(
            _agent(
                "deviced", "--node-name", "node-a", "--backend", "sim", *common,
                env={"NODE_IP": "10.0.0.7"}, log=tmp_path / "deviced-a.log",
            )
        )  # fmt: skip
        noded_b = ["--node-name", "node-b", "--node-ip", "10.0.0.8", *common]
        agents.append(_agent("noded", *noded_b, log=tmp_path / "noded-b.log"))

        def ips():
            return {n["name"]: n["node_ip"] for n in cd.get_json("/v1/nodes")}

        wait_for(lambda: ips() == {"node-a": "10.0.0.7", "node-b": "10.0.0.8"}, "both nodes with their IPs")
        # a second agent of node-a says another IP: the later Hello wins, logged and counted
        env = {"XDL_IP": "10.0.0.17"}
        agents.append(
            _agent("noded", "--node-name", "node-a", *common, env=env, log=tmp_path / "noded-a.log")
        )
        wait_for(lambda: ips()["node-a"] == "10.0.0.17", "node-a's IP from the later agent")
        with urllib.request.urlopen(cd.url("/metrics"), timeout=5) as r:
            metrics = r.read().decode()
        assert "faultmesh_node_ip_changes_total 1.0" in metrics
        log = cd.log_text()
        assert "node ip changed" in log and "node=node-a agent=noded old=10.0.0.7 new=10.0.0.17" in log
        assert ips()["node-b"] == "10.0.0.8"  # untouched
    finally:
        for p in agents:
            stop_proc(p, 15)
        cd.stop()
