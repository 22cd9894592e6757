"""Acknowledged faults (issue 31, clusterd.acks): an operator acknowledges a fault with a reason and
an expiry; it is stored (a restart keeps it), shown with the fault (/v1/faults, `faultmesh faults`,
/metrics' faultmesh_fault_acknowledged), recorded with who, from where and why in the history, and
ends by its stored deadline. The fault itself keeps its level. Writes need the token."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from support import eventually, make_clusterd

from faultmesh.model import Fault
from fmtools.cli import main as cli_main

TOKEN = "ack-token"
CODE = "80E18008"


def npu_fault(node: str, dev: int, code: str = CODE, level: str = "RestartNPU") -> Fault:
    return Fault(source="dcmi", node=node, device_type="NPU", device_id=dev, code=code, level=level)


async def start(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    cd = await make_clusterd(tmp_path, "--token-file", str(tmp_path / "token"))
    return cd


@pytest.fixture
async def acd(tmp_path):
    c = await start(tmp_path)
    yield c
    await c.stop()


async def get(cd, path: str):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{cd.http.port}{path}") as r:
            return await (r.json() if path.startswith("/v1") else r.text())


async def post(cd, path: str, body: dict, token: str | None = TOKEN) -> tuple[int, dict]:
    hdr = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{cd.http.port}{path}", json=body, headers=hdr) as r:
            return r.status, await r.json(content_type=None)


def cli(cd, tmp_path, *argv: str) -> int:
    http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "token")]
    try:
        return cli_main([*argv, *http])
    except SystemExit as e:  # argparse's usage error
        return int(e.code)


async def test_acknowledge_shows_everywhere_and_survives_a_restart(tmp_path, capsys):
    cd = await start(tmp_path)
    try:
        await cd.center.upsert(npu_fault("server-1", 3), origin="deviced")
        await cd.center.upsert(npu_fault("server-1", 5, "80CB8002", "SeparateNPU"), origin="deviced")
        before = await asyncio.to_thread(time.time)
        rc = await asyncio.to_thread(
            cli, cd, tmp_path, "ack", "server-1", CODE, "--for", "2h", "--by", "alice",
            "--reason", "known link flap, RMA 77",
        )  # fmt: skip
        assert rc == 0
        out = capsys.readouterr().out
        assert "alice (token default) until" in out and "known link flap, RMA 77" in out

        faults = {f["code"]: f for f in await get(cd, "/v1/faults?node=server-1")}
        ack = faults[CODE]["ack"]
        assert (ack["by"], ack["reason"], ack["auth"], ack["addr"]) == (
            "alice", "known link flap, RMA 77", "token", "127.0.0.1"
        )  # fmt: skip
        assert abs(ack["until_ms"] - (before + 7200) * 1000) < 60_000
        assert faults[CODE]["level"] == "RestartNPU"  # operator state, not a fault change
        assert faults["80CB8002"]["ack"] is None

        metrics = await get(cd, "/metrics")
        acked = [ln for ln in metrics.splitlines() if ln.startswith("faultmesh_fault_acknowledged{")]
        assert acked == [
            'faultmesh_fault_acknowledged{node="server-1",device_type="NPU",device="3",code="80E18008"} 1.0'
        ]

        rc = await asyncio.to_thread(cli, cd, tmp_path, "faults", "--node", "server-1")
        lines = capsys.readouterr().out.splitlines()
        assert rc == 0 and "ACKNOWLEDGED" in lines[0]
        [row] = [ln for ln in lines if CODE in ln]
        assert "alice (token default) until" in row
        assert not any("alice" in ln for ln in lines if "80CB8002" in ln)

        rc = await asyncio.to_thread(cli, cd, tmp_path, "history", "--node", "server-1", "--code", CODE)
        out = capsys.readouterr().out
        assert (
            rc == 0
            and "acknowledged by alice (token default) until" in out
            and "known link flap, RMA 77" in out
        )
        [row] = [e for e in await get(cd, "/v1/events?node=server-1") if e["kind"] == "ack"]
        assert (row["device_id"], row["source"], row["attributes"]["ack_addr"]) == (
            3,
            "operator",
            "127.0.0.1",
        )
    finally:
        await cd.stop()

    cd = await start(tmp_path)  # the same state dir: the acknowledgement is still in force
    try:
        [f] = [f for f in await get(cd, "/v1/faults?node=server-1") if f["code"] == CODE]
        assert f["ack"] is not None and f["ack"]["until_ms"] == ack["until_ms"]
        status, body = await post(cd, "/v1/acks/remove", {"node": "server-1", "code": CODE, "by": "bob",
                                                          "reason": "RMA done"})  # fmt: skip
        assert status == 200
        [f] = [f for f in await get(cd, "/v1/faults?node=server-1") if f["code"] == CODE]
        assert f["ack"] is None
        rc = await asyncio.to_thread(cli, cd, tmp_path, "history", "--node", "server-1", "--code", CODE)
        assert "acknowledgement removed by bob (token default): RMA done" in capsys.readouterr().out
    finally:
        await cd.stop()


async def test_acknowledgement_ends_by_its_deadline(acd, tmp_path, capsys):
    cd = acd
    await cd.center.upsert(npu_fault("server-2", 1), origin="deviced")
    status, body = await post(
        cd, "/v1/acks", {"node": "server-2", "code": CODE, "device": "NPU-1", "for_s": 1, "reason": "x"}
    )
    assert status == 200 and body["faults"] == 1
    assert (await get(cd, "/v1/acks"))[0]["device"] == "NPU-1"

    async def ended():
        events = await get(cd, "/v1/events?node=server-2")
        return [e for e in events if e["kind"] == "unack"]

    [row] = await eventually(ended, 15, "the expiry's history row")
    assert row["attributes"]["ack_ended"] == "expired"
    assert time.time() * 1000 >= body["ack"]["until_ms"]
    assert await get(cd, "/v1/acks") == []
    [f] = await get(cd, "/v1/faults?node=server-2")
    assert f["ack"] is None and f["level"] == "RestartNPU"
    assert "faultmesh_fault_acknowledged{" not in await get(cd, "/metrics")
    rc = await asyncio.to_thread(cli, cd, tmp_path, "history", "--node", "server-2")
    assert rc == 0 and "acknowledgement expired (by operator: x)" in capsys.readouterr().out


async def test_refused_without_token_and_bad_input(acd, tmp_path, capsys):
    cd = acd
    await cd.center.upsert(npu_fault("server-1", 3), origin="deviced")
    body = {"node": "server-1", "code": CODE, "for_s": 60, "reason": "r"}
    status, _ = await post(cd, "/v1/acks", body, token=None)
    assert status == 401
    assert await get(cd, "/v1/acks") == []
    for bad, word in (
        ({**body, "reason": ""}, "reason"),
        ({**body, "for_s": 0}, "for_s"),
        ({**body, "for_s": 8 * 86400}, "for_s"),
        ({**body, "for_s": "2h"}, "for_s"),
        ({**body, "node": 5}, "node"),
    ):
        status, answer = await post(cd, "/v1/acks", bad)
        assert status == 400 and word in answer["error"], (bad, answer)
    status, answer = await post(cd, "/v1/acks", {**body, "code": "80E18009"})
    assert status == 404 and "its active codes: 80E18008 (NPU-3)" in answer["error"]

    def run(*argv: str) -> tuple[int, str]:
        return cli(cd, tmp_path, *argv), capsys.readouterr().err

    base = ("ack", "server-1", CODE)
    rc, err = await asyncio.to_thread(run, *base, "--for", "2h")
    assert rc == 2 and "--reason" in err
    for dur in ("0", "8d", "soon"):
        rc, err = await asyncio.to_thread(run, *base, "--for", dur, "--reason", "r")
        assert rc == 2 and "--for" in err, (dur, err)
    rc, err = await asyncio.to_thread(run, "ack", "server-1", "80E18009", "--for", "2h", "--reason", "r")
    assert rc == 4 and "80E18008" in err
    rc, err = await asyncio.to_thread(run, "ack", "srever-1", CODE, "--for", "2h", "--reason", "r")
    assert rc == 4 and "did you mean 'server-1'" in err
    rc, err = await asyncio.to_thread(run, "unack", "server-1", CODE)
    assert rc == 4 and "no acknowledgement" in err
    assert await get(cd, "/v1/acks") == []


async def test_acknowledge_a_public_fault_by_its_id(acd, tmp_path, capsys):
    """A public fault sent for two NPUs is acknowledged (and un-acknowledged) by its fault id."""
    cd = acd
    for dev in (0, 1):
        f = Fault(
            "public:CCAE:f-77",
            "node-9",
            "NPU",
            dev,
            "010001001",
            "NotHandleFault",
            attributes={"faultId": "f-77"},
        )
        await cd.center.upsert(f, origin="public")

    def run(*argv: str) -> tuple[int, str, str]:
        rc = cli(cd, tmp_path, *argv)
        got = capsys.readouterr()
        return rc, got.out, got.err

    rc, out, _ = await asyncio.to_thread(
        run, "ack", "--fault-id", "f-77", "--for", "1h", "--reason", "vendor case"
    )
    assert rc == 0 and "NPU-0" in out and "NPU-1" in out
    faults = await get(cd, "/v1/faults?node=node-9")
    assert sorted(f["ack"]["device"] for f in faults) == ["NPU-0", "NPU-1"]
    assert {f["ack"]["reason"] for f in faults} == {"vendor case"}
    rc, _, err = await asyncio.to_thread(run, "ack", "--fault-id", "f-78", "--for", "1h", "--reason", "r")
    assert rc == 4 and "no active fault has the id 'f-78'" in err
    rc, _, err = await asyncio.to_thread(
        run, "ack", "node-9", "--fault-id", "f-77", "--for", "1h", "--reason", "r"
    )
    assert rc == 2 and "not both" in err
    rc, _, err = await asyncio.to_thread(run, "ack", "node-9", "--for", "1h", "--reason", "r")
    assert rc == 2 and "NODE and CODE are required" in err
    rc, out, _ = await asyncio.to_thread(run, "unack", "--fault-id", "f-77", "--reason", "closed")
    assert rc == 0 and out.count("acknowledgement removed") == 2
    assert all(f["ack"] is None for f in await get(cd, "/v1/faults?node=node-9"))


async def test_expiry_survives_a_refusing_store(acd, caplog, monkeypatch):
    """A store that refuses the expiry's delete: logged, tried again after RETRY_S (not in a tight
    loop), and the acknowledgement ends once the store takes it; the views end it at its deadline."""
    import logging
    import sqlite3

    from clusterd import acks

    cd = acd
    caplog.set_level(logging.ERROR, logger="clusterd.acks")
    monkeypatch.setattr(acks, "RETRY_S", 0.3)
    await cd.center.upsert(npu_fault("server-3", 2), origin="deviced")
    real = cd.store.kv_delete

    async def refuse(ns, key):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(cd.store, "kv_delete", refuse)
    status, body = await post(cd, "/v1/acks", {"node": "server-3", "code": CODE, "for_s": 0.2, "reason": "r"})
    assert status == 200
    await eventually(lambda: caplog.text.count("acknowledgement expiry failed") >= 2, 10, "two failed tries")
    [f] = await get(cd, "/v1/faults?node=server-3")
    assert f["ack"] is None  # past its deadline: not shown as acknowledged while the store refuses
    started = asyncio.get_running_loop().time()
    await asyncio.sleep(0.9)  # a tight loop would log ~18 times in this window (0.05 s passes)
    tries = caplog.text.count("acknowledgement expiry failed")
    assert tries <= 2 + int((asyncio.get_running_loop().time() - started) / 0.3) + 1, tries
    monkeypatch.setattr(cd.store, "kv_delete", real)

    async def ended():
        return [e for e in await get(cd, "/v1/events?node=server-3") if e["kind"] == "unack"]

    await eventually(ended, 10, "the expiry once the store takes it")
    assert cd.acks.active() == [] and await cd.store.kv_items("acks") == {}


async def test_unack_without_device_finds_the_one_per_device_ack(acd, tmp_path, capsys):
    """`faultmesh unack NODE CODE` ends a per-device acknowledgement when it is the only one of that
    code on the node; with several it lists their devices and ends none; `ack`'s "no active fault"
    names the devices of each active code."""
    cd = acd
    for dev in (1, 3, 10):
        await cd.center.upsert(npu_fault("server-4", dev), origin="deviced")
    await cd.center.upsert(npu_fault("server-4", 2, "80CB8002"), origin="deviced")

    def run(*argv: str) -> tuple[int, str, str]:
        rc = cli(cd, tmp_path, *argv)
        got = capsys.readouterr()
        return rc, got.out, got.err

    rc, _, err = await asyncio.to_thread(run, "ack", "server-4", "80E18009", "--for", "1h", "--reason", "r")
    assert rc == 4 and "its active codes: 80CB8002 (NPU-2), 80E18008 (NPU-1, NPU-3, NPU-10)" in err, err
    for dev in ("NPU-1", "NPU-3"):
        rc, _, _ = await asyncio.to_thread(
            run, "ack", "server-4", CODE, "--device", dev, "--for", "1h", "--reason", "flap"
        )
        assert rc == 0
    rc, _, err = await asyncio.to_thread(run, "unack", "server-4", CODE)
    assert rc == 5 and "acknowledged per device (NPU-1, NPU-3)" in err and "--device" in err, err
    assert sorted(a["device"] for a in await get(cd, "/v1/acks")) == ["NPU-1", "NPU-3"]  # none ended
    rc, out, _ = await asyncio.to_thread(run, "unack", "server-4", CODE, "--device", "NPU-1")
    assert rc == 0 and "NPU-1" in out
    rc, out, _ = await asyncio.to_thread(run, "unack", "server-4", CODE, "--reason", "fixed")
    assert rc == 0 and "NPU-3" in out and "acknowledgement removed" in out
    assert await get(cd, "/v1/acks") == []
    rc, _, err = await asyncio.to_thread(run, "unack", "server-4", CODE)
    assert rc == 4 and "no acknowledgement of 80E18008 on server-4" in err
