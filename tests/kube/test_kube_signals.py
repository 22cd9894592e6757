"""Node signals in Kubernetes mode (issue 15): a NodeCondition per fault class, an Event per fault
occur/recover, the optional NoSchedule taint and its circuit breaker -- on kmock."""

from __future__ import annotations

from kube.kubekit import kube_clusterd
from support import eventually

from clusterd.kube.signals import conditions_of
from faultmesh.model import Fault


async def conditions(api, node):
    obj = await api.get_node(node)
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


async def events(api, node):
    doc = await api._call("list events", api.core.list_namespaced_event, "default")
    return [e for e in doc.get("items") or [] if e["involvedObject"]["name"] == node]


async def test_fault_raises_a_condition_and_an_event_and_recovery_clears_them(k8s, kcd):
    emu, api = k8s
    npu = Fault("deviced", "node-1", "NPU", 2, "80E18008", "RestartNPU")
    await kcd.center.upsert(npu, origin="deviced")

    async def npu_down():
        c = await conditions(api, "node-1")
        return c if c.get("NPUHealthy", {}).get("status") == "False" else None

    c = await eventually(npu_down, what="NPUHealthy=False")
    assert c["NPUHealthy"]["reason"] == "RestartNPU"
    assert c["NPUHealthy"]["message"] == "NPU 2 80E18008 RestartNPU"
    assert c["NodeHardwareHealthy"]["status"] == "True" and c["SlowNode"]["status"] == "False"
    evs = await eventually(lambda: events(api, "node-1"), what="occur event")
    assert evs[0]["reason"] == "FaultOccurred" and evs[0]["type"] == "Warning"
    assert "80E18008" in evs[0]["message"] and evs[0]["involvedObject"]["kind"] == "Node"
    # a slow node and a node hardware fault raise their own conditions
    await kcd.center.upsert(
        Fault("noded", "node-1", "Node", -1, "110001010", "SubHealthFault"), origin="noded"
    )
    await kcd.center.upsert(
        Fault("bmc-oem", "node-1", "Memory", 3, "0800004B", "SeparateFault"), origin="noded"
    )

    async def all_three():
        c = await conditions(api, "node-1")
        ok = c.get("SlowNode", {}).get("status") == "True" and c["NodeHardwareHealthy"]["status"] == "False"
        return c if ok else None

    c = await eventually(all_three, what="SlowNode and NodeHardwareHealthy")
    assert c["NodeHardwareHealthy"]["reason"] == "SeparateFault"
    # recovery: conditions back, a recover event
    await kcd.center.apply([], [npu.key], "deviced")

    async def npu_up():
        c = await conditions(api, "node-1")
        return c if c["NPUHealthy"]["status"] == "True" else None

    c = await eventually(npu_up, what="NPUHealthy=True")
    assert c["NPUHealthy"]["reason"] == "NoFault"
    await eventually(lambda: _has(events(api, "node-1"), "FaultRecovered"), what="recover event")


async def _has(evs_coro, reason):
    return any(e["reason"] == reason for e in await evs_coro)


def test_condition_message_is_bounded_and_informational_faults_do_not_count():
    faults = [Fault("d", "n", "NPU", i, "80E18008", "RestartNPU") for i in range(12)]
    faults.append(Fault("d", "n", "NPU", 99, "00000001", "NotHandleFault"))
    c = conditions_of(faults)
    status, reason, message = c["NPUHealthy"]
    assert status == "False" and reason == "RestartNPU"
    assert message.endswith("; and 4 more") and "00000001" not in message
    assert conditions_of([faults[-1]])["NPUHealthy"][0] == "True"


async def test_taint_is_off_by_default_and_the_breaker_limits_it(k8s, tmp_path):
    emu, api = k8s
    nodes = [f"n-{i}" for i in range(10)]
    for n in nodes:
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    # default: no taint, even on an UnHealthy node
    cd = await kube_clusterd(tmp_path / "a", api.url)
    try:
        await cd.center.upsert(Fault("deviced", "n-0", "NPU", 0, "80E18008", "SeparateNPU"), origin="deviced")
        await eventually(lambda: _cond_status(api, "n-0", "NPUHealthy", "False"), what="condition")
        assert not ((await api.get_node("n-0")).get("spec") or {}).get("taints")
    finally:
        await cd.stop()
    # on, with a breaker at 20 % of 10 nodes: two nodes tainted, the third held back
    cd = await kube_clusterd(tmp_path / "b", api.url, "--kube-taint", "on", "--kube-taint-max-share", "0.2")
    try:
        for n in nodes[:3]:
            await cd.center.upsert(Fault("deviced", n, "NPU", 0, "80E18008", "SeparateNPU"), origin="deviced")

        async def tainted():
            out = []
            for n in nodes:
                taints = ((await api.get_node(n)).get("spec") or {}).get("taints") or []
                if any(t["key"] == "faultmesh.io/unhealthy" and t["effect"] == "NoSchedule" for t in taints):
                    out.append(n)
            return out

        await eventually(lambda: _len_is(tainted(), 2), what="two tainted")
        await eventually(
            lambda: cd.registry.get_sample_value("faultmesh_kube_taint_breaker_open") == 1,
            what="breaker open",
        )
        assert len(await tainted()) == 2
        # one recovers: its taint goes, and the held-back node gets its taint
        first = sorted(await tainted())[0]
        await cd.center.apply(
            [], [Fault("deviced", first, "NPU", 0, "80E18008", "SeparateNPU").key], "deviced"
        )
        await eventually(
            lambda: _tainted_set_changed(tainted(), first), what="taint moved to the held-back node"
        )
        assert len(await tainted()) == 2
    finally:
        await cd.stop()


async def _cond_status(api, node, t, status):
    return (await conditions(api, node)).get(t, {}).get("status") == status


async def _len_is(coro, n):
    return len(await coro) == n


async def _tainted_set_changed(coro, gone):
    got = await coro
    return len(got) == 2 and gone not in got
