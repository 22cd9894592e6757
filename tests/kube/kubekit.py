"""Builders of the reference agents' ConfigMaps for the Kubernetes-mode tests."""

from __future__ import annotations

import json

from support import make_clusterd

from faultmesh import gojson


def node_info_cm(info: dict, check: str | None = None, update: str = "2026-01-02T03:04:05+08:00") -> dict:
    code = check if check is not None else gojson.check_code(gojson.canon_node_info(info))
    return {"NodeInfo": json.dumps({"NodeInfo": info, "CheckCode": code}), "updateTime": update}


def device_info_cm(
    device_list: dict, update_time: int = 1767000041, check: str | None = None, **extra
) -> dict:
    inner = {"DeviceList": device_list, "UpdateTime": update_time}
    code = check if check is not None else gojson.check_code(gojson.canon_device_info(inner))
    doc = {"DeviceInfo": inner, "SuperPodID": -2, "ServerIndex": -2, "CheckCode": code, **extra}
    return {"DeviceInfoCfg": json.dumps(doc)}


def job_pod(
    name: str,
    node: str,
    rank_index: int,
    devices: list[int],
    uid: str = "uid-job-1",
    job: str = "llama",
    phase: str = "Running",
    **annotations: str,
) -> dict:
    conf = {
        "pod_name": name,
        "server_id": "10.0.0.1",
        "devices": [{"device_id": str(d), "device_ip": "1.1.1.1"} for d in devices],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "train",
            "annotations": {
                "ascend.kubectl.kubernetes.io/ascend-910-configuration": json.dumps(conf),
                "hccl/rankIndex": str(rank_index),
                **annotations,
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch.volcano.sh/v1alpha1",
                    "kind": "Job",
                    "name": job,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": phase},
    }


def podgroup(labels: dict, annotations: dict, uid: str = "uid-job-1", **rest) -> dict:
    """The Volcano PodGroup ``train/llama-pg`` of the vcjob ``llama`` (``rest``: e.g. ``status``)."""
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "llama-pg",
            "namespace": "train",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "llama", "uid": uid,
                 "controller": True}
            ],
        },
        "spec": {"minMember": 2},
        **rest,
    }  # fmt: skip


async def kube_clusterd(tmp_path, url: str, *extra: str):
    """An in-process clusterd in Kubernetes mode against the API at ``url`` (fast write and timeout
    settings for tests; ``extra`` flags come last and win). The caller stops it."""
    return await make_clusterd(
        tmp_path, "--kube", "--kube-api", url, "--kube-min-write-s", "0.02", "--kube-timeout-s", "2", *extra
    )
