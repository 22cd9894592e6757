"""The scrape and the node list read maintained indexes (issue 18); what they say must always equal
the fault center, through every occur, upgrade, owner change and recover."""

from __future__ import annotations

import aiohttp
from support import eventually

from clusterd.nodes import SLOW_NODE_CODE
from faultmesh.agent import AgentClient
from faultmesh.levels import HEALTHY, SUB_HEALTHY, UNHEALTHY
from faultmesh.model import Fault


def fault(node: str, code: str, level: str, dev: int = 0, source: str = "deviced") -> Fault:
    return Fault(source=source, node=node, device_type="NPU", device_id=dev, code=code, level=level)


def scraped(cd) -> tuple[set[str], set[str], dict[str, str]]:
    """(slow nodes, unhealthy nodes, node -> health) as the /metrics collector reports them."""
    slow, bad, health = set(), set(), {}
    for fam in cd.registry.collect():
        for s in fam.samples:
            if s.name == "faultmesh_slow_node" and s.value == 1:
                slow.add(s.labels["node"])
            elif s.name == "faultmesh_node_unhealthy" and s.value == 1:
                bad.add(s.labels["node"])
            elif s.name == "faultmesh_node_health" and s.value == 1:
                health[s.labels["node"]] = s.labels["health"]
    return slow, bad, health


def truth(cd) -> tuple[set[str], set[str], dict[str, str]]:
    """The same three answers computed from every fault of the center, the slow way."""
    slow = {f.node for f in cd.center.faults() if f.code == SLOW_NODE_CODE}
    health = {}
    for n in cd.nodes.all_names():
        fs = cd.center.faults(n)
        health[n] = (
            UNHEALTHY
            if any(f.level in ("SeparateNPU", "SeparateFault") for f in fs)
            else SUB_HEALTHY
            if any(f.level == "SubHealthFault" for f in fs)
            else HEALTHY
        )
    return slow, {n for n, h in health.items() if h == UNHEALTHY}, health


async def test_the_scrape_follows_every_change_of_the_fault_center(cd):
    await cd.center.upsert(fault("n1", SLOW_NODE_CODE, "SubHealthFault", -1, "fd-online"))
    await cd.center.upsert(fault("n2", "80E18008", "SubHealthFault"))
    await cd.center.upsert(fault("n2", "80E18009", "SeparateNPU", dev=1))
    assert scraped(cd) == truth(cd)
    assert scraped(cd)[0] == {"n1"} and scraped(cd)[2] == {"n1": SUB_HEALTHY, "n2": UNHEALTHY}
    await cd.center.upsert(fault("n1", SLOW_NODE_CODE, "SeparateNPU", -1, "fd-online"))  # upgrade
    await cd.center.remove(fault("n2", "80E18009", "SeparateNPU", dev=1).key)  # recover the worst
    assert scraped(cd) == truth(cd)
    assert scraped(cd)[2] == {"n1": UNHEALTHY, "n2": SUB_HEALTHY}
    await cd.center.replace_source("n1", "fd-online", [])  # the slow-node fault recovers
    await cd.center.upsert(fault("n3", SLOW_NODE_CODE, "SubHealthFault", -1, "fd-online"))
    assert scraped(cd) == truth(cd)
    assert scraped(cd)[0] == {"n3"} and cd.center.index.node_health("n1") == (HEALTHY, "")


async def test_the_node_list_names_each_nodes_own_agents(cd):
    await cd.center.upsert(fault("n1", "80E18008", "SubHealthFault"))
    await cd.center.upsert(fault("n2", "80E18009", "SeparateNPU", source="fd-online"))  # not the agents'
    clients = [
        AgentClient(f"127.0.0.1:{cd.grpc_port}", n, a) for n, a in (("n2", "deviced"), ("n2", "noded"))
    ]
    for c in clients:
        await c.start()
    try:
        await eventually(lambda: len(cd.agents.connected()) == 2)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{cd.http.port}/v1/nodes") as r:
                assert r.status == 200
                body = await r.json()
        got = {n["name"]: (n["health"], n["faults"], n["agents"]) for n in body}
        assert got == {"n1": (SUB_HEALTHY, 1, []), "n2": (UNHEALTHY, 1, ["deviced", "noded"])}
    finally:
        for c in clients:
            await c.stop()


async def test_the_fast_scrape_text_is_what_prometheus_client_writes(cd):
    from prometheus_client import CollectorRegistry, generate_latest

    from clusterd.nodehealth import NodeHealthCollector

    await cd.center.upsert(fault("n1", SLOW_NODE_CODE, "SubHealthFault", -1, "fd-online"))
    await cd.center.upsert(fault('odd"node\\x', "80E18009", "SeparateNPU"))  # escaped label values
    cd.nodes.set_stale("n1", "noded", "Disconnected", 1)
    own = NodeHealthCollector(cd.nodes, cd.center)
    reg = CollectorRegistry()
    reg.register(own)
    assert own.text() == generate_latest(reg)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{cd.http.port}/metrics") as r:
            body = await r.text()
    assert body.count("# TYPE faultmesh_node_health gauge") == 1  # once: not also from collect()
    assert 'faultmesh_node_health{health="SubHealthy",node="n1"} 1.0' in body
    assert 'faultmesh_slow_node{node="n1"} 1.0' in body and "faultmesh_clusterd_ready" in body


async def test_the_kept_scrape_lines_follow_health_changes_after_the_first_scrape(cd):
    from prometheus_client import CollectorRegistry, generate_latest

    from clusterd.nodehealth import NodeHealthCollector

    own = NodeHealthCollector(cd.nodes, cd.center)
    reg = CollectorRegistry()
    reg.register(own)

    def same() -> bool:
        return own.text() == generate_latest(reg)

    await cd.center.upsert(fault("n1", "80E18008", "SubHealthFault"))
    await cd.center.upsert(fault("n2", "80E18009", "SeparateNPU"))
    assert same()  # the lines are kept from here on
    await cd.center.upsert(fault("n1", "80E18009", "SeparateNPU", dev=1))  # n1 worse
    await cd.center.remove(fault("n2", "80E18009", "SeparateNPU").key)  # n2 recovers
    cd.nodes.set_status("n3", "noded", UNHEALTHY)  # a reporter, no fault: a new node
    assert same()
    assert 'faultmesh_node_unhealthy{node="n1"} 1.0' in own.text().decode()
    assert 'node="n2"' not in own.text().decode()  # its last fault recovered: no longer known
    cd.nodes.set_status("n3", "noded", None)
    assert same() and 'faultmesh_node_unhealthy{node="n3"}' not in own.text().decode()


async def test_the_node_list_follows_every_change_after_the_first_request(cd):
    async def listed() -> dict[str, dict]:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{cd.http.port}/v1/nodes") as r:
                assert r.status == 200 and r.content_type == "application/json"
                return {n["name"]: n for n in await r.json()}

    await cd.center.upsert(fault("n1", "80E18008", "SubHealthFault"))
    cd.nodes.hello("n2", "10.0.0.2", "sn2", "boot")
    first = await listed()
    assert first["n1"]["health"] == SUB_HEALTHY and first["n2"]["node_ip"] == "10.0.0.2"
    await cd.center.upsert(fault("n1", "80E18009", "SeparateNPU", dev=1))
    cd.nodes.hello("n2", "10.0.0.9", "sn2", "boot")
    cd.nodes.update("n2", conditions=[{"type": "Mem", "active": True, "reason": "r"}], status=SUB_HEALTHY)
    now = await listed()
    assert (now["n1"]["health"], now["n1"]["faults"]) == (UNHEALTHY, 2)
    assert now["n2"]["node_ip"] == "10.0.0.9" and now["n2"]["node_status"] == SUB_HEALTHY
    assert [c["type"] for c in now["n2"]["conditions"]] == ["Mem"]
    cd.nodes.update("n2", conditions=[], replace=True)
    await cd.center.remove(fault("n1", "80E18008", "SubHealthFault").key)
    cd.nodes.set_stale("n1", "deviced", "Disconnected", 1)
    last = await listed()
    assert last["n2"]["conditions"] == [] and last["n1"]["faults"] == 1
    assert last["n1"]["stale_agents"] == ["deviced"]
    async with aiohttp.ClientSession() as s:  # each entry is what the node's own page says
        for name, body in last.items():
            async with s.get(f"http://127.0.0.1:{cd.http.port}/v1/nodes/{name}") as r:
                own = await r.json()
            assert body == {k: own[k] for k in body}
