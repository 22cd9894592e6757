"""Leader election in Kubernetes mode (issue 15 HA, first part): with ``--kube-leader-elect on`` only
the Lease holder writes; a stopped leader hands over within seconds, an expired Lease is taken over.
"""

from __future__ import annotations

import json
import time

from kube.kubekit import kube_clusterd
from support import eventually

from faultmesh.kube import KubeError
from faultmesh.lease import LeaseElector
from faultmesh.model import Fault

# no publish hold-off here (it is 15 s by default with election on; tested in test_kube_mode.py)
ELECT = ("--kube-leader-elect", "on", "--kube-lease-namespace", "faultmesh", "--kube-publish-holdoff-s", "0")


def kube(cd):
    return next(c for c in cd.components if c.name == "kube")


async def node_cm(api) -> dict:
    try:
        cm = await api.get_config_map("mindx-dl", "cluster-info-node-cm")
    except KubeError as e:
        if e.status == 404:
            return {}
        raise
    v = (cm.get("data") or {}).get("cluster-info-node-cm") or ""
    return json.loads(v) if v else {}


async def test_only_the_leader_writes_and_a_stopped_leader_hands_over(k8s, tmp_path):
    emu, api = k8s
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    cd1 = await kube_clusterd(tmp_path / "a", api.url, *ELECT)
    cd2 = None
    try:
        await eventually(lambda: kube(cd1).elector.leading.is_set(), what="first replica leads")
        cd2 = await kube_clusterd(tmp_path / "b", api.url, *ELECT)
        await cd2.center.upsert(
            Fault("noded", "node-2", "CPU", 0, "00000001", "SeparateFault"), origin="noded"
        )
        await cd1.center.upsert(
            Fault("noded", "node-1", "CPU", 0, "00000001", "SeparateFault"), origin="noded"
        )
        await eventually(lambda: _has(node_cm(api), "mindx-dl-nodeinfo-node-1"), what="leader publishes")
        assert not kube(cd2).elector.leading.is_set()
        assert "mindx-dl-nodeinfo-node-2" not in await node_cm(api)  # the follower wrote nothing
        t0 = time.monotonic()
        await cd1.stop()
        cd1 = None
        await eventually(lambda: kube(cd2).elector.leading.is_set(), timeout_s=15, what="follower leads")
        assert time.monotonic() - t0 < 15
        await eventually(lambda: _has(node_cm(api), "mindx-dl-nodeinfo-node-2"), what="new leader publishes")
    finally:
        for cd in (cd1, cd2):
            if cd is not None:
                await cd.stop()


async def test_an_expired_lease_is_taken_over_and_a_live_one_is_not(k8s):
    emu, api = k8s
    t = [0.0]
    a = LeaseElector(api, "faultmesh", "l", "a", lease_s=15, clock=lambda: t[0])
    b = LeaseElector(api, "faultmesh", "l", "b", lease_s=15, clock=lambda: t[0])
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # held and fresh
    t[0] = 10.0
    assert await a.try_acquire_or_renew()  # renewed: b's observation restarts
    assert not await b.try_acquire_or_renew()
    t[0] = 26.0  # a stopped renewing 15 s ago (by b's own clock)
    assert await b.try_acquire_or_renew()
    lease = await api._call("get", api.coordination.read_namespaced_lease, "l", "faultmesh")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_acquire_or_renew()  # a now sees b's fresh record


async def _has(coro, key):
    return key in await coro


async def test_a_writer_added_to_the_leadership_runs_while_leading_only():
    """Leadership.add (the control ConfigMaps' fault-job-info writer joins after the Kubernetes
    component started): added before a term it starts with the term; added during one it starts at
    once; a lost Lease cancels both, and the next term runs both again."""
    import asyncio
    from types import SimpleNamespace

    from clusterd.kube.leader import Leadership

    elector = SimpleNamespace(leading=asyncio.Event(), listeners=[])
    running: dict[str, int] = {"early": 0, "late": 0}
    started: list[str] = []

    def writer(name):
        async def run():
            started.append(name)
            running[name] += 1
            try:
                await asyncio.Event().wait()
            finally:
                running[name] -= 1

        return run

    lead = Leadership(
        elector, [], lambda coro, name: asyncio.get_running_loop().create_task(coro), lambda: None
    )
    lead.add("early", writer("early"))
    task = asyncio.get_running_loop().create_task(lead.run())
    try:
        await asyncio.sleep(0.05)
        assert started == []  # not leading: nothing runs
        elector.leading.set()
        await eventually(lambda: running == {"early": 1, "late": 0}, what="the early writer runs")
        lead.add("late", writer("late"))
        await eventually(lambda: running == {"early": 1, "late": 1}, what="the late writer runs at once")
        elector.leading.clear()
        for listener in list(elector.listeners):
            listener(False)
        await eventually(lambda: running == {"early": 0, "late": 0}, what="both cancelled on loss")
        elector.leading.set()
        await eventually(lambda: running == {"early": 1, "late": 1}, what="both run in the next term")
        assert sorted(started) == ["early", "early", "late", "late"]
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=5)
