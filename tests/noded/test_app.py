"""The noded app: command line, the source tuple and control routing, node-info file, level reload, HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from dataclasses import dataclass

import pytest
from support import free_port, make_clusterd

from faultmesh import config
from faultmesh._pb import agent_pb2
from faultmesh.source import PushSource
from noded import sources
from noded.app import NodeD, build_parser
from noded.sources import SOURCES, Bmc, Dpc, Dtfs, Pingmesh, SlowNode


@dataclass(frozen=True)
class FakeConfig:
    """The fake source's section: ``fake_flag`` ``--fake-flag``."""

    fake_flag: str


class FakeSource(PushSource):
    """A source in noded's shape (add_arguments, Config, from_config, start(ctx) registering control kinds)."""

    name = "fake"
    Config = FakeConfig
    control_kinds = ("pingmesh_config", "topology")
    seen: list = []

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--fake-flag", default="x")

    @classmethod
    def from_config(cls, cfg, metrics):
        return cls(cfg)

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.started = False

    async def start(self, ctx):
        await super().start(ctx)
        for kind in self.control_kinds:
            ctx.on_control(kind, self.on_control)
        self.started = True

    async def stop(self):
        self.started = False
        await super().stop()

    async def on_control(self, msg):
        FakeSource.seen.append(msg.WhichOneof("body"))


def parse(*argv, classes=SOURCES):
    return config.parse(build_parser(tuple(classes)), list(argv))


def test_sources_tuple_is_the_one_extension_model():
    assert [c.name for c in SOURCES] == ["bmc", "dpc", "dtfs", "pingmesh", "slownode"]
    assert SOURCES == (Bmc, Dpc, Dtfs, Pingmesh, SlowNode)
    # each source gets just its own flags as its config section
    a = parse("--node-name", "n1", "--dpc-status-file", "/d", "--profiling-dir", "/p")
    assert vars(sources.config_section(a, Dpc)) == {
        "dpc_status_file": "/d",
        "dtfs_status_file": None,
        "storage_interval": 5.0,
        "storage_memory_hold_s": 600.0,
    }
    assert sources.config_section(a, SlowNode).profiling_dir == "/p"
    assert not hasattr(sources.config_section(a, SlowNode), "bmc_host")


@pytest.mark.parametrize("cls", SOURCES, ids=lambda c: c.name)
def test_each_source_section_is_its_flags_typed(cls):
    """Issue 28: a source's typed section (``cls.Config``) holds exactly the flags its add_arguments
    defines, with their types, no second default, each flag named in its docstring."""
    import argparse
    import dataclasses

    probe = argparse.ArgumentParser(add_help=False)
    cls.add_arguments(probe)
    assert [f.name for f in dataclasses.fields(cls.Config)] == [a.dest for a in probe._actions]
    assert config.section_problems(cls.Config, build_parser()) == []


def test_flags_env_and_ranges(monkeypatch, capsys):
    monkeypatch.setenv("FAULTMESH_POLL_INTERVAL", "30")
    monkeypatch.setenv("FAULTMESH_TLS_CA", "/etc/ca.crt")  # what the Helm chart sets
    a = parse("--node-name", "n1", "--clusterd-token-file", "/tok", classes=[*SOURCES, FakeSource])
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


async def test_control_messages_reach_sources_through_clusterd(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="noded")
    cd = await make_clusterd(tmp_path)
    FakeSource.seen = []
    args = parse(
        "--node-name",
        "node-c",
        "--clusterd",
        f"127.0.0.1:{cd.grpc_port}",
        "--http-addr",
        "127.0.0.1:0",
        "--min-report-interval",
        "0",
        classes=[Bmc, FakeSource],
    )
    nd = NodeD(args, (Bmc, FakeSource))
    try:
        await nd.start()
        fake = nd.sources[1]
        assert fake.started
        started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("noded started")]
        assert 'sources="bmc(no host),fake"' in started[0], started  # no BMC host: said so (tryout)
        await asyncio.wait_for(nd.agent.connected.wait(), 10)
        await nd.agent.wait_synced(10)
        assert await cd.agents.send("node-c", "noded", pingmesh_config=agent_pb2.PingmeshConfig())
        assert await cd.agents.send(
            "node-c", "noded", data_trace=agent_pb2.DataTraceSwitch()
        )  # nobody handles
        assert await cd.agents.send("node-c", "noded", topology=agent_pb2.SuperPodTopology(super_pod_id="1"))
        for _ in range(100):
            if FakeSource.seen == ["pingmesh_config", "topology"]:
                break
            await asyncio.sleep(0.05)
        assert FakeSource.seen == ["pingmesh_config", "topology"]
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
    assert not fake.started


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
    nd = NodeD(args, (Bmc, Dpc, Dtfs))
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
            "faultmesh_noded_bmc_poll_duration_seconds_bucket",
            "faultmesh_noded_bmc_polls_total",
            "faultmesh_noded_bmc_last_success_timestamp_seconds",
            "faultmesh_noded_faults{",
            "faultmesh_noded_level_table_reloads_total",
            "faultmesh_noded_storage_reads_total",
            'faultmesh_noded_node_status{status="UnHealthy"} 1.0',
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


class BrokenInit(FakeSource):
    name = "broken-init"

    @classmethod
    def from_config(cls, cfg, metrics):
        raise RuntimeError("cannot build")


class BrokenStart(FakeSource):
    name = "broken-start"
    control_kinds = ("ping_list",)

    async def start(self, ctx):
        raise RuntimeError("start failed")


async def test_broken_sources_do_not_take_noded_down(caplog):
    args = parse(
        "--node-name",
        "node-b",
        "--clusterd",
        f"127.0.0.1:{free_port()}",
        "--http-addr",
        "127.0.0.1:0",
        classes=[BrokenInit, BrokenStart, FakeSource],
    )
    nd = NodeD(args, (BrokenInit, BrokenStart, FakeSource))
    try:
        await nd.start()
        assert [s.name for s, _ in nd.started] == ["fake"]
        assert nd.started[0][0].started
        status, _ = await asyncio.to_thread(_get, nd.http.port, "/healthz")
        assert status == 200
        assert caplog.text.count("source not started") == 2
        with pytest.raises(LookupError):  # the broken source's control kind is not routed
            await nd.on_control(agent_pb2.ControlMessage(seq=3, ping_list=agent_pb2.PingList()))
    finally:
        await nd.stop()


class HangingStop(FakeSource):
    """A source whose stop never returns on its own (a hung DCMI call, say)."""

    name = "hanging"

    async def stop(self):
        await asyncio.sleep(3600)


async def test_stop_fits_the_budget_with_a_hanging_source(caplog):
    args = parse(
        "--node-name",
        "node-h",
        "--clusterd",
        f"127.0.0.1:{free_port()}",
        "--http-addr",
        "127.0.0.1:0",
        "--stop-budget",
        "3",
        "--stop-sources-budget",
        "1",
        classes=[HangingStop],
    )
    nd = NodeD(args, (HangingStop,))
    await nd.start()
    t0 = asyncio.get_running_loop().time()
    await nd.stop()
    took = asyncio.get_running_loop().time() - t0
    assert took < 3.0, took
    assert "source stop overran" in caplog.text
    assert nd.started == []


async def test_http_mutations_need_the_agent_token_when_one_is_configured(tmp_path):
    """issue 19 #7: noded's HTTP port takes the agent's token; a token-less mutating request gets
    401 (before routing: no route is revealed), with the token routing answers; reads stay open."""
    import aiohttp

    token = tmp_path / "token"
    token.write_text("agent-token\n")
    nd = NodeD(
        parse("--node-name", "n1", "--clusterd", "127.0.0.1:1", "--http-addr", "127.0.0.1:0",
              "--clusterd-token-file", str(token), classes=[FakeSource]),
        (FakeSource,),
    )  # fmt: skip
    await nd.start()
    base = f"http://127.0.0.1:{nd.http.port}"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/v1/state") as r:
                assert r.status == 401
            async with s.post(f"{base}/v1/state", headers={"Authorization": "Bearer agent-token"}) as r:
                assert r.status == 405  # authenticated: now the router answers
            async with s.get(f"{base}/v1/state") as r:
                assert r.status == 200
    finally:
        await nd.stop()
