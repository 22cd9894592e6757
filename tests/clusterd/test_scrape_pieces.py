"""The scrape caches re-render only the nodes marked changed (issue 18): after any sequence of
changes, ``/metrics``'s node families and ``/v1/nodes`` are byte for byte what a fresh render of
the same state writes."""

from __future__ import annotations

import random

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from support import eventually

from clusterd.http.nodes import NodeApi
from clusterd.nodehealth import NodeHealthCollector
from clusterd.nodes import SLOW_NODE_CODE
from clusterd.pieces import SortedPieces
from faultmesh.agent import AgentClient
from faultmesh.levels import SUB_HEALTHY, UNHEALTHY
from faultmesh.model import Fault


def test_sorted_pieces_join_as_a_sorted_join_through_inserts_updates_and_drops():
    rnd = random.Random(7)
    pieces: SortedPieces[str] = SortedPieces(",", chunk=4)
    want: dict[str, str] = {}
    for step in range(3000):
        key = f"k{rnd.randrange(300):03d}"
        if rnd.random() < 0.35:
            pieces.drop(key)
            want.pop(key, None)
        else:
            pieces.put(key, f"{key}={step}")
            want[key] = f"{key}={step}"
        if step % 37 == 0:
            assert pieces.join() == ",".join(want[k] for k in sorted(want))
    assert pieces.join() == ",".join(want[k] for k in sorted(want)) and len(pieces) == len(want)
    pieces.reset([("b", "2"), ("a", "1")])
    assert pieces.join() == "1,2" and "a" in pieces and "z" not in pieces


def fault(node: str, code: str, level: str, dev: int = 0, source: str = "deviced") -> Fault:
    return Fault(source=source, node=node, device_type="NPU", device_id=dev, code=code, level=level)


async def test_the_kept_scrape_and_node_list_equal_a_fresh_render_after_every_kind_of_change(cd):
    own = NodeHealthCollector(cd.nodes, cd.center)  # the incremental text beside prometheus_client's
    reg = CollectorRegistry()
    reg.register(own)
    url = f"http://127.0.0.1:{cd.http.port}"

    async with aiohttp.ClientSession() as s:

        async def check() -> None:
            assert own.text() == generate_latest(reg)
            async with s.get(url + "/v1/nodes") as r:
                assert r.status == 200
                body = await r.read()
            assert body == NodeApi(cd.center, cd.nodes, cd.agents).list_body()  # a fresh render
            async with s.get(url + "/metrics") as r:
                assert own.text() in await r.read()

        await cd.center.upsert(fault("n1", "80E18008", "SubHealthFault"))
        cd.nodes.hello("n2", "10.0.0.2", "sn2", "boot")
        await check()  # from here on both are kept and re-rendered per changed node
        rnd = random.Random(3)
        levels = ("SubHealthFault", "SeparateNPU", "NotHandleFault")
        for _ in range(60):
            node = f"n{rnd.randrange(8)}"
            op = rnd.randrange(9)
            if op == 0:
                await cd.center.upsert(fault(node, "80E18008", rnd.choice(levels), dev=rnd.randrange(2)))
            elif op == 1:
                await cd.center.remove(fault(node, "80E18008", "x", dev=rnd.randrange(2)).key)
            elif op == 2:
                await cd.center.upsert(fault(node, SLOW_NODE_CODE, "SubHealthFault", -1, "fd-online"))
            elif op == 3:
                await cd.center.replace_source(node, "fd-online", [])
            elif op == 4:
                cd.nodes.set_status(node, "kube:nodeinfo", rnd.choice([UNHEALTHY, SUB_HEALTHY, None]))
            elif op == 5:
                cd.nodes.set_stale(
                    node, rnd.choice(["noded", "deviced"]), rnd.choice(["Disconnected", None]), 5
                )
            elif op == 6:
                cd.nodes.update(
                    node, conditions=[{"type": "Mem", "active": rnd.random() < 0.5, "reason": "r"}]
                )
            elif op == 7:
                cd.nodes.set_pending(node, "noded", rnd.choice([[], ["bmc"], ["bmc", "storage"]]))
            else:
                cd.nodes.hello(node, f"10.0.0.{rnd.randrange(3)}", "sn", "boot")
            await check()
        for node in sorted(cd.nodes.names()):  # nodes go away: their lines and entries with them
            cd.nodes.agent_seen(node, "noded")
            cd.nodes.forget_agent(node, "noded")
            await check()
        client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "n9", "deviced")  # a stream adds a node
        await client.start()
        try:
            await eventually(lambda: ("n9", "deviced") in cd.agents.connected())
            await check()
        finally:
            await client.stop()
        await eventually(lambda: ("n9", "deviced") not in cd.agents.connected())
        await check()  # and its end shows it stale, no longer connected
