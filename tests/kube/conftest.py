"""Fixtures of the Kubernetes-mode tests: kmock's API emulator and clusterd ``--kube`` against it."""

from __future__ import annotations

import pytest
from kube.kubekit import kube_clusterd

from faultmesh.kube import KubeApi

kmock = pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")
pytest.importorskip("kubernetes_asyncio", reason="kubernetes_asyncio not installed")


@pytest.fixture
async def k8s():
    """(emulator, api) — kmock's emulator on loopback and a KubeApi client for the test's own calls."""
    from kubernetes_asyncio import client

    async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as srv:
        emu.resources["v1/configmaps"] = {}
        emu.resources["v1/nodes"] = {}
        emu.resources["v1/pods"] = {}
        emu.resources["v1/events"] = {}
        emu.resources["scheduling.volcano.sh/v1beta1/podgroups"] = {}
        emu.resources["coordination.k8s.io/v1/leases"] = {}
        url = str(srv.url).rstrip("/")
        async with client.ApiClient(client.Configuration(host=url)) as apic:
            api = KubeApi(apic, timeout_s=5)
            api.url = url
            yield emu, api


@pytest.fixture
async def kcd(k8s, tmp_path):
    """clusterd in Kubernetes mode against the emulator, with nodes node-1 and node-2."""
    emu, api = k8s
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    cd = await kube_clusterd(tmp_path, api.url, "--kube-resync-s", "0.5")
    yield cd
    await cd.stop()
