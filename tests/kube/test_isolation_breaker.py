"""The isolation circuit breaker (issue 30): a bad fault-table push that raises one code to SeparateNPU
on every node at once isolates at most the configured share of the nodes in the cluster-info documents
Volcano schedules by; the rest is held (the faults still show), the breaker's state is a metric, and
an operator's release lets the rest through."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from kube.kubekit import kube_clusterd
from prometheus_client import CollectorRegistry
from support import eventually

from clusterd.audit import why_of as why
from clusterd.breaker import IsolationBreaker
from faultmesh.kube import KubeError
from faultmesh.model import Fault
from fmtools.cli import main as cli_main

pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")

NODES = [f"node-{i}" for i in range(4)]


async def unhealthy_nodes(api) -> set[str] | None:
    """Nodes the published device shard lists with an unhealthy NPU (None before a shard exists)."""
    try:
        cm = await api.get_config_map("mindx-dl", "cluster-info-device-0")
    except KubeError:
        return None
    doc = json.loads((cm.get("data") or {}).get("cluster-info-device-0") or "{}")
    return {
        e["CmName"].removeprefix("mindx-dl-deviceinfo-")
        for e in doc.values()
        if e["DeviceList"].get("huawei.com/Ascend910-Unhealthy")
    }


async def test_a_bad_push_holds_at_the_share_and_a_release_lets_the_rest_through(k8s, tmp_path):
    _emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, "--isolation-max-share", "0.5", "--isolation-window-s", "600")
    try:
        for n in NODES:
            cd.nodes.hello(n, "", f"SN-{n}", "boot")
        for n in NODES:  # a common code raised to SeparateNPU everywhere at once
            await cd.center.upsert(Fault("deviced", n, "NPU", 0, "80E18008", "SeparateNPU"), origin="deviced")

        async def two():
            got = await unhealthy_nodes(api)
            return got if got is not None and len(got) == 2 else None

        async def held_two():  # the publisher rebuilds the nodes in turn: the last two are held
            return cd.registry.get_sample_value("faultmesh_isolation_held_nodes") == 2 or None

        await eventually(held_two, what="the other two nodes held")
        first = await eventually(two, what="two nodes published unhealthy")
        assert cd.registry.get_sample_value("faultmesh_isolation_breaker_open") == 1
        assert len(cd.center.faults()) == 4  # held, not hidden: every fault is still shown
        base = f"http://127.0.0.1:{cd.http.port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/v1/breaker") as r:
                st = await r.json()
            assert st["open"] and sorted(st["held"]) == sorted(set(NODES) - first) and st["limit"] == 2
        rc = await asyncio.to_thread(
            cli_main,
            ["release", "breaker", "--reason", "checked the faults", "--http", f"127.0.0.1:{cd.http.port}"],
        )
        assert rc == 0
        assert cd.breaker.held == {} and not cd.breaker.open
        for node in set(NODES) - first:  # who and why in each released node's history (issue 31)
            [row] = [e for e in await cd.store.query_events(node) if e["kind"] == "release"]
            assert row["code"] == "IsolationBreaker" and "released by" in why(row)
            assert row["attributes"]["release_reason"] == "checked the faults"

        async def all_four():
            got = await unhealthy_nodes(api)
            return got if got == set(NODES) else None

        await eventually(all_four, what="every node published unhealthy after the release")
        assert cd.registry.get_sample_value("faultmesh_isolation_breaker_open") == 0
    finally:
        await cd.stop()
    # a restart keeps what was published isolated: the four are adopted, none is held or unpublished
    cd = await kube_clusterd(tmp_path, api.url, "--isolation-max-share", "0.5", "--isolation-window-s", "600")
    try:
        for n in NODES:
            cd.nodes.hello(n, "", f"SN-{n}", "boot")
        await eventually(lambda: set(NODES) <= cd.breaker.isolated, what="the four adopted after the restart")
        assert await unhealthy_nodes(api) == set(NODES)
        assert cd.registry.get_sample_value("faultmesh_isolation_breaker_open") == 0 and cd.breaker.held == {}
    finally:
        await cd.stop()


def test_the_window_frees_room_and_a_recovered_node_is_forgotten():
    now = [0.0]
    b = IsolationBreaker(0.5, 600, lambda: 4, CollectorRegistry(), clock=lambda: now[0])
    assert b.admit("a", "p") and b.admit("b", "p") and not b.admit("c", "p")
    assert b.admit("a", "p")  # already isolated: no new room needed
    b.forget("c")
    assert b.held == {}
    now[0] = 601.0  # the first two left the window
    assert b.admit("c", "p") and b.admit("d", "p")
    assert IsolationBreaker(1.0, 600, lambda: 4, CollectorRegistry()).admit("x", "p")  # 1.0: off
