"""Kubernetes mode: a MindIE service found from its pods gets the reference's global rank table
(issue 14 item 6). Reference: pkg/domain/epranktable/ranktable_manager.go InformerHandler (pods and
ConfigMaps with label ``jobID``), ranktable_util.go getPdDeployModeServers (a coordinator /
controller pod: ``server_id`` = status.hostIP, ``server_ip`` = status.podIP) and the server's HCCL
table (``device_ip`` of each NPU from the pod's device annotation)."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from kube.conftest import k8s, kcd  # noqa: F401 (fixtures)
from kube.kubekit import job_pod

from faultmesh._pb import config_pb2, config_pb2_grpc

pytest.importorskip("kmock", reason="kmock not installed (pip install '.[dev]')")

MINDIE = "mindie-kube-1"


def member(pod: dict, app: str, pod_ip: str, host_ip: str, npus: bool = True) -> dict:
    pod["metadata"]["labels"] = {"jobID": MINDIE, "app": app}
    pod["status"].update(podIP=pod_ip, hostIP=host_ip)
    if not npus:
        pod["metadata"]["annotations"] = {}
    return pod


async def test_a_mindie_service_from_pods_gets_its_global_rank_table(k8s, kcd):  # noqa: F811
    emu, api = k8s
    pods = [
        member(job_pod("coord-0", "node-1", 0, [], uid="uid-co", job="co"), "mindie-ms-coordinator",
               "172.16.0.3", "10.0.0.1", npus=False),
        member(job_pod("ctl-0", "node-1", 0, [], uid="uid-ctl", job="ctl"), "mindie-ms-controller",
               "172.16.0.4", "10.0.0.1", npus=False),
        member(job_pod("srv-0", "node-2", 0, [0, 1], uid="uid-srv", job="srv"), "mindie-ms-server",
               "172.16.1.5", "10.0.0.2"),
    ]  # fmt: skip
    for p in pods:
        await api._call("create pod", api.core.create_namespaced_pod, "train", p)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{kcd.grpc_port}") as ch:
        stub = config_pb2_grpc.ConfigStub(ch)
        ci = config_pb2.ClientInfo(jobId=MINDIE, role="mindie-ms-controller")
        assert (await stub.Register(ci)).code == 0
        call = stub.SubscribeRankTable(ci)
        async with asyncio.timeout(20):
            while True:  # tables built before every member was found may come first
                table = json.loads((await call.read()).rankTable)
                if len(table["server_group_list"]) == 3:
                    break
        g0, g1, g2 = table["server_group_list"]
        assert g0["server_list"] == [{"server_id": "10.0.0.1", "server_ip": "172.16.0.3"}]
        assert g1["server_list"] == [{"server_id": "10.0.0.1", "server_ip": "172.16.0.4"}]
        (srv,) = g2["server_list"]
        assert (srv["server_id"], srv["server_ip"]) == ("10.0.0.2", "172.16.1.5")
        assert [d["device_ip"] for d in srv["device"]] == ["1.1.1.1", "1.1.1.1"]
        call.cancel()
