"""The noded app: command line, components and control routing, node-info file, level reload, HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

import pytest
from support import free_port, make_clusterd

from faultmesh import config
from faultmesh._pb import agent_pb2
from noded import app as noded_app
from noded.app import NodeD, build_parser, load_component_classes


class FakeComponent:
    """A component in the shape the brief gives (pingmesh, slownode use it)."""

    name = "fake"
    control_kinds = ("pingmesh_config", "topology")
    seen: list = []

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--fake-flag", default="x")

    def __init__(self, app):
        self.app = app
        self.started = False

    async def start(self):
        self.started = True

    async def stop(self):
        self.started = False

    async def on_control(self, msg):
        FakeComponent.seen.append(msg.WhichOneof("body"))


def parse(*argv, classes=()):
    return config.parse(build_parser(list(classes)), list(argv))


def test_components_tuple_starts_with_pingmesh_and_slownode():
    assert noded_app.COMPONENTS[:2] == (
        "noded.pingmesh:PingmeshComponent",
        "noded.slownode:SlowNodeComponent",
    )


def test_missing_component_is_skipped_and_reported():
    classes, missing = load_component_classes(
        ("noded.not_landed_yet:Thing", "noded.app:NodeD", "noded.app:Nope")
    )
    assert classes == [NodeD]
    assert [m[0] for m in missing] == ["noded.not_landed_yet:Thing", "noded.app:Nope"]
    assert "ModuleNotFoundError" in missing[0][1]


def test_flags_env_and_ranges(monkeypatch, capsys):
    monkeypatch.setenv("FAULTMESH_POLL_INTERVAL", "30")
    monkeypatch.setenv("FAULTMESH_TLS_CA", "/etc/ca.crt")  # what the Helm chart sets
    a = parse("--node-name", "n1", "--clusterd-token-file", "/tok", classes=[FakeComponent])
    assert (
        a.poll_interval == 30 and a.tls_ca == "/etc/ca.crt" and a.token_file == "/tok" and a.fake_flag == "x"
    )
    monkeypatch.delenv("FAULTMESH_POLL_INTERVAL")
    for bad in ("0", "601"):
        with pytest.raises(SystemExit):
            parse("--node-name", "n1", "--poll-interval", bad)
    assert parse("--node-name", "n1", "--poll-interval", "1").poll_interval == 1
    assert parse("--node-name", "n1").poll_interval == 60


def test_bmc_host_without_password_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("FAULTMESH_BMC_PASSWORD", raising=False)
    with pytest.raises(ValueError, match="password"):
        NodeD(parse("--node-name", "n1", "--bmc-host", "127.0.0.1"))


async def test_control_messages_reach_components_through_clusterd(tmp_path):
    cd = await make_clusterd(tmp_path)
    FakeComponent.seen = []
    args = parse(
        "--node-name",
        "node-c",
        "--clusterd",
        f"127.0.0.1:{cd.grpc_port}",
        "--http-addr",
        "127.0.0.1:0",
        "--min-report-interval",
        "0",
        classes=[FakeComponent],
    )
    nd = NodeD(args, [FakeComponent])
    try:
        await nd.start()
        assert nd.components[0].started
        await asyncio.wait_for(nd.agent.connected.wait(), 10)
        await nd.agent.wait_synced(10)
        assert await cd.agents.send("node-c", "noded", pingmesh_config=agent_pb2.PingmeshConfig())
        assert await cd.agents.send(
            "node-c", "noded", data_trace=agent_pb2.DataTraceSwitch()
        )  # nobody handles
        assert await cd.agents.send("node-c", "noded", topology=agent_pb2.SuperPodTopology(super_pod_id="1"))
        for _ in range(100):
            if FakeComponent.seen == ["pingmesh_config", "topology"]:
                break
            await asyncio.sleep(0.05)
        assert FakeComponent.seen == ["pingmesh_config", "topology"]
        with pytest.raises(LookupError):
            await nd.on_control(agent_pb2.ControlMessage(seq=9, data_trace=agent_pb2.DataTraceSwitch()))
        # no BMC configured: the node is still reported, with the reason
        status, body = await asyncio.to_thread(_get, cd.http.port, "/v1/nodes/node-c")
        view = json.loads(body)
        assert view["node_status"] == "Healthy"
        conds = {c["type"]: c for c in view["conditions"]}
        assert conds["BMCUnreachable"]["active"] and conds["BMCUnreachable"]["reason"] == "NotConfigured"
    finally:
        await nd.stop()
        await cd.stop()
    assert not nd.components[0].started


def _get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.read().decode()


async def test_node_info_file_level_reload_storage_and_http(tmp_path, bmc_sim):
    levels = tmp_path / "levels.json"
    levels.write_text(json.dumps({"FaultTypeCode": {"PreSeparateFaultCodes": ["0800004B"]}}))
    dpc = tmp_path / "dpc_status_check"
    dpc.write_text("[instidx=0]\nDPC_INTERNAL_ERROR: 0\nDPC_PROCESS_ERROR: -1\n")
    os.chmod(dpc, 0o644)
    info_file = tmp_path / "node-info.json"
    args = parse(
        "--node-name",
        "node-d",
        "--clusterd",
        f"127.0.0.1:{free_port()}",
        "--http-addr",
        "127.0.0.1:0",
        "--bmc-host",
        "127.0.0.1",
        "--bmc-port",
        str(bmc_sim.port),
        "--bmc-password-file",
        str(bmc_sim.password_file),
        "--poll-interval",
        "1",
        "--levels-file",
        str(levels),
        "--levels-check-interval",
        "0.1",
        "--node-info-file",
        str(info_file),
        "--dpc-status-file",
        str(dpc),
        "--storage-interval",
        "0.2",
    )
    bmc_sim.add_alarm("0800004B", "Memory", 3)
    nd = NodeD(args, [])
    try:
        await nd.start()
        port = nd.http.port

        async def until(pred, what):
            for _ in range(100):
                if pred():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(what)

        await until(lambda: info_file.exists(), "node-info file")
        doc = json.loads(json.loads(info_file.read_text())["NodeInfo"])
        assert doc["NodeInfo"]["FaultDevList"][0]["FaultLevel"] == "PreSeparateFault"
        await until(lambda: any(k.source == "dpc" for k in nd.state.faults), "dpc fault")
        assert nd.state.node_status == "PreSeparate"  # storage faults do not change the node status

        levels.write_text(json.dumps({"FaultTypeCode": {"SeparateFaultCodes": ["0800004B"]}}))
        st = os.stat(levels)
        os.utime(levels, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        await until(lambda: nd.state.node_status == "UnHealthy", "relevelled after reload")
        await until(lambda: "SeparateFault" in info_file.read_text(), "node-info rewritten")

        status, body = await asyncio.to_thread(_get, port, "/v1/node-info")
        assert json.loads(body)["NodeInfo"]["NodeStatus"] == "UnHealthy"
        status, body = await asyncio.to_thread(_get, port, "/healthz")
        assert status == 200
        status, body = await asyncio.to_thread(_get, port, "/metrics")
        for name in (
            "noded_bmc_poll_duration_seconds_bucket",
            "noded_bmc_polls_total",
            "noded_bmc_last_success_timestamp_seconds",
            "noded_faults{",
            "noded_level_table_reloads_total",
            "noded_storage_reads_total",
            'noded_node_status{status="UnHealthy"} 1.0',
        ):
            assert name in body, name

        bmc_sim.clear_alarms()
        await until(lambda: not info_file.exists(), "node-info removed when healthy")
    finally:
        await nd.stop()


async def test_tls_and_token_to_clusterd(tmp_path, bmc_sim):
    from noded_support import make_pki

    ca, files = make_pki(tmp_path)
    token = tmp_path / "token"
    token.write_text("agent-token\n")
    cd = await make_clusterd(
        tmp_path,
        "--tls-cert",
        str(files["server"][0]),
        "--tls-key",
        str(files["server"][1]),
        "--tls-ca",
        str(ca),
        "--token-file",
        str(token),
    )
    bmc_sim.add_alarm("0800004B", "Memory", 3)
    common = [
        "--clusterd",
        f"127.0.0.1:{cd.grpc_port}",
        "--http-addr",
        "127.0.0.1:0",
        "--bmc-host",
        "127.0.0.1",
        "--bmc-port",
        str(bmc_sim.port),
        "--bmc-password-file",
        str(bmc_sim.password_file),
        "--poll-interval",
        "1",
        "--min-report-interval",
        "0",
        "--clusterd-tls-ca",
        str(ca),
        "--clusterd-tls-cert",
        str(files["client"][0]),
        "--clusterd-tls-key",
        str(files["client"][1]),
    ]
    good = NodeD(parse("--node-name", "node-tls", "--clusterd-token-file", str(token), *common))
    bad = NodeD(parse("--node-name", "node-notoken", *common))
    try:
        await good.start()
        await bad.start()
        for _ in range(100):
            codes = {(f.node, f.code) for f in cd.center.faults()}
            if ("node-tls", "0800004B") in codes:
                break
            await asyncio.sleep(0.1)
        assert ("node-tls", "0800004B") in codes
        assert cd.nodes.get("node-tls").node_sn == "2102SIM0000001"  # Hello carries the iBMC's SN
        await asyncio.sleep(0.5)
        assert not any(f.node == "node-notoken" for f in cd.center.faults())  # no token: refused
        assert not bad.agent.synced.is_set()
    finally:
        await good.stop()
        await bad.stop()
        await cd.stop()


class BrokenInit(FakeComponent):
    name = "broken-init"

    def __init__(self, app):
        raise RuntimeError("cannot start")


class BrokenStart(FakeComponent):
    name = "broken-start"
    control_kinds = ("ping_list",)

    async def start(self):
        raise RuntimeError("start failed")


async def test_broken_components_do_not_take_noded_down(caplog):
    args = parse(
        "--node-name",
        "node-b",
        "--clusterd",
        f"127.0.0.1:{free_port()}",
        "--http-addr",
        "127.0.0.1:0",
        classes=[BrokenInit, BrokenStart, FakeComponent],
    )
    nd = NodeD(args, [BrokenInit, BrokenStart, FakeComponent])
    try:
        await nd.start()
        assert [c.name for c in nd.components] == ["broken-start", "fake"]
        assert nd.components[1].started
        status, _ = await asyncio.to_thread(_get, nd.http.port, "/healthz")
        assert status == 200
        assert "component not started" in caplog.text
    finally:
        await nd.stop()
