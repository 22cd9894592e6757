"""The manual-separation policy (reference clusterd.md §6.2, §8): N counted occurrences of a code on
one NPU within the window separate it (ManuallySeparateNPU in the fault center, stored across a
restart); a software fault (same code on another NPU within 30 s) is not counted; only an
operator's authenticated release (HTTP or ``faultmesh release``) or the fault-free time clears it;
a bad policy file is rejected and the last good policy stays."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import make_clusterd

from clusterd.separation import CODE, SOURCE, Policy, PolicyError
from faultmesh.model import Fault
from fmtools.cli import main as cli_main

S = 1000
TOKEN = "s3cret-token"


class Clock:
    def __init__(self) -> None:
        self.t = 1_767_000_000_000

    def __call__(self) -> int:
        return self.t


def npu_fault(node: str, dev: int, code: str = "80E18008", level: str = "RestartNPU") -> Fault:
    return Fault(source="dcmi", node=node, device_type="NPU", device_id=dev, code=code, level=level)


async def occur_once(cd, f: Fault) -> None:
    await cd.center.upsert(f, origin="deviced")
    await cd.center.remove(f.key)


async def settle(cd) -> None:
    await cd.center.drain_sinks(2.0)


async def start(tmp_path):
    (tmp_path / "token").write_text(TOKEN)
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "enabled: true\nseparate: {fault_window_hours: 1, fault_threshold: 2}\nrelease: {fault_free_hours: 1}\n"
    )
    args = ["--token-file", str(tmp_path / "token"), "--manual-separation-policy", str(policy)]
    cd = await make_clusterd(tmp_path, *args)
    clock = Clock()
    cd.separation.clock = clock
    return cd, clock, policy, args


@pytest.fixture
async def env(tmp_path):
    e = await start(tmp_path)
    yield e
    await e[0].stop()


async def separate_by_policy(cd, clock, node="node-1", dev=3) -> None:
    for _ in range(2):
        await occur_once(cd, npu_fault(node, dev))
        await settle(cd)
        clock.t += 31 * S
        await cd.separation.tick()
        clock.t += 60 * S


async def test_policy_separates_and_release_needs_the_token(env):
    cd, clock, _policy, _ = env
    assert cd.separation.policy == Policy(True, 1, 2, 1)
    await occur_once(cd, npu_fault("node-1", 3, level="NotHandleFault"))  # not counted
    await separate_by_policy(cd, clock)
    sep = cd.center.get(npu_fault("node-1", 3).key._replace(code=CODE, source=SOURCE))
    assert sep is not None and sep.level == "ManuallySeparateNPU" and sep.attributes["codes"] == "80E18008"
    assert cd.nodes.health("node-1")[0] == "UnHealthy"
    base = f"http://127.0.0.1:{cd.http.port}"
    async with aiohttp.ClientSession() as s:
        body = {"node": "node-1", "device_id": 3, "reason": "chip replaced"}
        async with s.post(f"{base}/v1/release/npu", json=body) as r:
            assert r.status == 401  # never without the token
        hdr = {"Authorization": f"Bearer {TOKEN}"}
        async with s.get(f"{base}/v1/separations") as r:
            assert [x["device_id"] for x in await r.json()] == [3]
        async with s.post(f"{base}/v1/release/npu", json={**body, "device_id": 4}, headers=hdr) as r:
            assert r.status == 404
        async with s.post(f"{base}/v1/release/npu", json={"node": "node-1"}, headers=hdr) as r:
            assert r.status == 400
        for no_reason in (
            {"node": "node-1", "device_id": 3},
            {"node": "node-1", "device_id": 3, "reason": "  "},
        ):
            async with s.post(f"{base}/v1/release/npu", json=no_reason, headers=hdr) as r:
                assert r.status == 400 and "reason is required" in (await r.json())["error"]
        assert cd.separation.separated  # a release without a reason released nothing
        async with s.post(f"{base}/v1/release/npu", json=body, headers=hdr) as r:
            assert r.status == 200 and (await r.json())["released"][0]["device_id"] == 3
    assert not cd.separation.separated and not cd.center.faults_of_origin(SOURCE)


async def test_software_fault_is_not_counted(env):
    cd, clock, _, _ = env
    for _ in range(3):
        await occur_once(cd, npu_fault("node-1", 3))
        await occur_once(cd, npu_fault("node-2", 0))  # same code elsewhere within 30 s
        await settle(cd)
        clock.t += 31 * S
        await cd.separation.tick()
    assert not cd.separation.separated and cd.separation.stats["software"] == 6


async def test_separation_survives_restart_and_cli_release(tmp_path):
    cd, clock, _, args = await start(tmp_path)
    await separate_by_policy(cd, clock, "node-7", 5)
    await cd.stop()
    cd2 = await make_clusterd(tmp_path, *args)
    try:
        assert list(cd2.separation.separated) == [("node-7", 5)]
        [sep] = cd2.center.faults_of_origin(SOURCE)
        assert sep.device_id == 5
        # the rule and its occurrences are kept across the restart (no update row either)
        assert (
            sep.attributes["upgrade_rule"]
            == "manual separation policy: 80E18008 2 times in 1 h -> ManuallySeparateNPU"
        )
        assert len(sep.attributes["upgrade_occurrences_ms"].split(",")) == 2
        events = await cd2.store.query_events("node-7", CODE)
        assert [e["kind"] for e in events] == ["occur"]
        http = ["--http", f"127.0.0.1:{cd2.http.port}", "--token-file", str(tmp_path / "token")]
        rc = await asyncio.to_thread(cli_main, ["release", "npu", "node-7/5", "--reason", "RMA 12", *http])
        assert rc == 0
        assert not cd2.separation.separated and not cd2.center.faults_of_origin(SOURCE)
        rc = await asyncio.to_thread(cli_main, ["release", "npu", "node-7/5", "--reason", "RMA 12", *http])
        assert rc == 4  # nothing left to release: not found (faultmesh exit codes)
    finally:
        await cd2.stop()


async def test_release_node_clears_npus_and_stress_test_isolation(env, tmp_path, capsys):
    cd, clock, _, _ = env
    await separate_by_policy(cd, clock, "node-4", 1)
    await cd.brain.isolate_nodes("job-1", ["node-4"])
    assert cd.nodes.health("node-4")[0] == "UnHealthy"
    http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "token"), "-o", "json"]
    rc = await asyncio.to_thread(
        cli_main, ["release", "node", "node-4", "--reason", "stress test passed", *http]
    )
    assert rc == 0
    released = json.loads(capsys.readouterr().out)["released"]
    assert {r["code"] for r in released} == {CODE, "StressTestIsolate"}
    assert cd.center.faults_of_node("node-4") == []


async def test_fault_free_time_releases(env):
    cd, clock, _, _ = env
    await separate_by_policy(cd, clock)
    clock.t += 3600 * S + 1
    await cd.separation.tick()
    assert not cd.separation.separated and cd.separation.stats["released_fault-free"] == 1


async def test_bad_policy_rejected_last_good_stays(env):
    cd, _clock, policy, _ = env
    good = cd.separation.policy
    for text, why in (
        ("separate: {fault_window_hours: 0}\n", "separate.fault_window_hours: 0 outside 1..720"),
        ("separate: {fault_threshold: -3}\n", "fault_threshold: -3 outside 1..50"),
        ("release: {fault_free_hours: 0}\n", "fault_free_hours: 0 outside 1..240 or -1"),
        ("enabled: maybe\n", "enabled: 'maybe' is not true/false"),
        ("separate: {fault_threshold: '3'}\n", "is not an integer"),
        ("- a list\n", "top level must be a mapping"),
        ("x: " + "y" * 70_000 + "\n", "larger than"),
    ):
        policy.write_text(text)
        assert cd.separation.reload_policy() is False
        assert cd.separation.policy == good
        with pytest.raises(PolicyError, match=why.replace("(", r"\(").replace(".", r"\.")):
            Policy.load(policy)
    sample = cd.registry.get_sample_value("faultmesh_config_rejected_total", {"file": "policy.yaml"})
    assert sample == 7
    policy.write_text("enabled: false\n")
    assert cd.separation.reload_policy() is True and not cd.separation.policy.enabled


async def test_devices_own_separation_released_through_clusterd(env, tmp_path):
    """deviced's ManuallySeparateNPU (its frequency rule) is released by the operator through
    clusterd's authenticated API; clusterd forwards it on the agent stream."""
    from support import until

    from deviced.app import DeviceD
    from deviced.app import build_parser as deviced_parser
    from deviced.backends import SimBackend

    cd, _clock, _, _ = env
    sim = SimBackend(1, 2)
    dargs = deviced_parser().parse_args(
        ["--node-name", "node-d", "--backend", "sim", "--clusterd", f"127.0.0.1:{cd.grpc_port}",
         "--token-file", str(tmp_path / "token"), "--probe-interval", "0", "--list-watch-period", "3"]
    )  # fmt: skip
    dv = DeviceD(dargs, sim)
    await dv.start()
    try:

        def level():
            f = [f for f in cd.center.faults_of_node("node-d") if f.device_id == 1 and f.code == "80E18008"]
            return f[0].level if f else None

        await until(lambda: dv.cycles >= 1)
        for _ in range(2):  # 80E18008 twice in 24 h -> deviced's own ManuallySeparateNPU
            sim.inject(1, 0x80E18008, 1)
            await until(lambda: dv.state.devices[("NPU", 1)].health == "UnHealthy")
            sim.inject(1, 0x80E18008, 0)
            await asyncio.sleep(1.2)
        await until(lambda: level() == "ManuallySeparateNPU")
        http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "token")]
        assert (
            await asyncio.to_thread(cli_main, ["release", "npu", "node-d/1", "--reason", "reseated", *http])
            == 0
        )
        await until(lambda: level() is None)  # released in deviced, gone from clusterd
        assert dv.state.devices[("NPU", 1)].level == ""
    finally:
        await dv.stop()
    await until(lambda: ("node-d", "deviced") not in cd.agents.connected())
    await cd.center.upsert(npu_fault("node-d", 0, level="ManuallySeparateNPU"), origin="deviced")
    hdr = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{cd.http.port}/v1/release/npu"
        async with s.post(url, json={"node": "node-d", "device_id": 0, "reason": "x"}, headers=hdr) as r:
            assert r.status == 503  # deviced not connected: its separation stays


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 200), st.sampled_from(["n1", "n2"]), st.integers(0, 2), st.sampled_from("AB")
        ),
        max_size=40,
    )
)
def test_software_fault_index_answers_as_the_pairwise_scan(rows):
    """``on_another_npu`` (indexed, for bursts of thousands of faults) gives the answer of the
    definition: the same code on another NPU within the window."""
    from clusterd.separation import on_another_npu

    seen = [(t, n, d, c, False) for t, n, d, c in rows]
    want = [
        any(c2 == c and (n2, d2) != (n, d) and abs(t2 - t) <= 30 for t2, n2, d2, c2, _ in seen)
        for t, n, d, c, _ in seen
    ]
    assert on_another_npu(seen, seen, 30) == want


async def test_the_history_says_who_released_and_why(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="clusterd.separation")
    cd, clock, _, _ = await start(tmp_path)
    try:
        await separate_by_policy(cd, clock, "node-7", 5)
        http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "token")]
        rc = await asyncio.to_thread(
            cli_main,
            ["release", "npu", "node-7/5", "--by", "alice", "--reason", "card swapped, RMA 4711", *http],
        )
        assert rc == 0
        await cd.center.drain_sinks(5.0)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{cd.http.port}/v1/events?node=node-7&code={CODE}") as r:
                events = await r.json()
        [rec] = [e for e in events if e["kind"] == "recover"]
        a = rec["attributes"]
        assert (a["released_by"], a["release_reason"], a["release_auth"], a["release_token"]) == (
            "alice",
            "card swapped, RMA 4711",
            "token",
            "default",  # the one token of a plain token file
        )
        assert a["release_addr"] == "127.0.0.1"
        assert "npu separation released" in caplog.text and "released_by=alice" in caplog.text
        capsys.readouterr()
        rc = await asyncio.to_thread(cli_main, ["history", "--node", "node-7", "--code", CODE, *http])
        assert rc == 0
        out = capsys.readouterr().out
        assert (
            "WHY" in out.splitlines()[0]
            and "released by alice (token default): card swapped, RMA 4711" in out
        )
        hdr = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as s:
            body = {"node": "node-7", "device_id": 5, "reason": "x" * 600}
            async with s.post(f"http://127.0.0.1:{cd.http.port}/v1/release/npu", json=body, headers=hdr) as r:
                assert r.status == 400 and "reason" in json.loads(await r.text())["error"]
    finally:
        await cd.stop()


async def test_history_names_the_policy_rule_and_who_released_a_deviced_chip(
    env, tmp_path, capsys, monkeypatch
):
    """issue 31: the occur row of a policy separation names the rule and its occurrences; releasing a
    chip deviced separated (its own frequency rule) records who, from where and why in a history row
    of its own (deviced's recover carries no note). The connected deviced is a stand-in that records
    the release it is sent."""
    cd, clock, _, _ = env
    await separate_by_policy(cd, clock, "node-2", 4)
    await cd.center.drain_sinks(5.0)
    http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "token")]
    rc = await asyncio.to_thread(cli_main, ["history", "--node", "node-2", "--code", CODE, *http])
    out = capsys.readouterr().out
    assert (
        rc == 0
        and "manual separation policy: 80E18008 2 times in 1 h -> ManuallySeparateNPU (2 occurrences)" in out
    )

    sent = []

    async def deviced_stand_in(node, agent, **msg):
        sent.append((node, agent, msg["release"].phy_id, msg["release"].seen_until_ms))
        return True

    monkeypatch.setattr(cd.agents, "send", deviced_stand_in)
    held = Fault(
        source="dcmi", node="node-3", device_type="NPU", device_id=2, code=CODE, level=CODE,
        last_seen_ms=1_765_000_000_123,
    )  # fmt: skip
    await cd.center.upsert(held, origin="deviced")
    rc = await asyncio.to_thread(
        cli_main, ["release", "npu", "node-3/2", "--by", "alice", "--reason", "chip reseated", *http]
    )
    # what deviced held when the operator released: a copy delivered again spares a newer separation
    assert rc == 0 and sent == [("node-3", "deviced", 2, 1_765_000_000_123)]
    [row] = [e for e in await cd.store.query_events("node-3") if e["kind"] == "release"]
    a = row["attributes"]
    assert (row["device_id"], a["released_by"], a["release_reason"], a["release_auth"], a["release_addr"]) == (
        2, "alice", "chip reseated", "token", "127.0.0.1"
    )  # fmt: skip
    capsys.readouterr()
    rc = await asyncio.to_thread(cli_main, ["history", "--node", "node-3", *http])
    assert rc == 0 and "released by alice (token default): chip reseated" in capsys.readouterr().out


async def test_cli_release_needs_a_reason_suggests_the_node_and_names_the_operator(env, tmp_path, capsys):
    """issue 31: what an operator types and reads. No --reason is exit 2 before anything is sent; a
    typo'd node is exit 4 with the node clusterd knows; the table's BY is the operator (the claimed
    name and the verified token's), HELD BY who held the separation."""
    cd, clock, _, _ = env
    await separate_by_policy(cd, clock, "node-7", 5)
    http = ["--http", f"127.0.0.1:{cd.http.port}", "--token-file", str(tmp_path / "token")]

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            rc = cli_main([*argv, *http])
        except SystemExit as e:  # argparse's usage error
            rc = int(e.code)
        got = capsys.readouterr()
        return rc, got.out, got.err

    rc, _, err = await asyncio.to_thread(run, "release", "npu", "node-7/5")
    assert rc == 2 and "--reason" in err
    rc, _, err = await asyncio.to_thread(run, "release", "node", "node-7", "--reason", " ")
    assert rc == 2 and "--reason is empty: say why" in err
    assert cd.separation.separated  # nothing was sent
    for argv in (("npu", "nod-7/5"), ("node", "nod-7")):
        rc, _, err = await asyncio.to_thread(run, "release", *argv, "--reason", "swapped")
        assert rc == 4 and "clusterd does not know node 'nod-7' (did you mean 'node-7'?)" in err, err
    rc, _, err = await asyncio.to_thread(run, "release", "npu", "node-7/4", "--reason", "swapped")
    assert rc == 4 and "NPU node-7/4 is not manually separated" in err  # a known node: the server's words
    rc, out, _ = await asyncio.to_thread(
        run, "release", "npu", "node-7/5", "--by", "alice", "--reason", "swapped"
    )
    head, row = out.splitlines()
    assert head.split() == ["NODE", "ID", "RELEASED", "HELD", "BY", "BY"]
    assert row.split() == ["node-7", "5", CODE, "clusterd", "alice", "(token", "default)"]
