"""clusterd writes ``data-trace-<job>`` in Kubernetes mode as the reference's ClusterD does (issue 29;
clusterd.md §3): the CLI's ModifyTrainingDataTraceSwitch creates it in the job's namespace with the
reference's label and JSON, a switch off updates it, the job's deletion deletes it, a follower
writes nothing, a failed write answers 500 and is retried; clusterd's own write does not come back
through its reader, and a bad ConfigMap from outside is counted with the last good switch kept."""

from __future__ import annotations

import asyncio
import json

import pytest
from kube.kubekit import kube_clusterd
from kube.test_kube_control import NS, UID, component, put_labelled, rejected, start_job
from kube.test_kube_leader import ELECT, kube
from support import eventually

from clusterd.brain.datatrace import DataTraceError
from faultmesh.kube import KubeError
from fmtools.cli import main as cli_main

ON = '{"CommunicationOperator":"on","Step":"on","SaveCheckpoint":"on","FP":"on","DataLoader":"on"}'
OFF = ON.replace('"on"', '"off"')


async def data_trace_cm(api, job: str = "llama") -> dict | None:
    try:
        return await api.get_config_map(NS, f"data-trace-{job}")
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def writes(cd, result: str = "ok") -> float:
    v = cd.registry.get_sample_value("faultmesh_kube_writes_total", {"kind": "data_trace", "result": result})
    return v or 0.0


def trace(cd, *argv: str) -> int:
    try:
        return cli_main(["trace", *argv, "--grpc", f"127.0.0.1:{cd.grpc_port}"])
    except SystemExit as e:
        return int(e.code)


async def test_cli_switch_creates_updates_and_job_deletion_deletes_the_configmap(k8s, kcd, capsys):
    emu, api = k8s
    await start_job(api, kcd)
    control = component(kcd, "kube-control")
    assert await asyncio.to_thread(trace, kcd, "on", f"{NS}/llama") == 0
    cm = await eventually(lambda: data_trace_cm(api), what="data-trace-llama created")
    assert cm["metadata"]["namespace"] == NS and cm["metadata"]["labels"] == {"reset": "true"}
    assert cm["data"] == {"profilingSwitch": ON}  # the reference's Go JSON, byte for byte
    # the reader sees clusterd's own version and does not apply it again (the echo guard)
    await eventually(lambda: control.handled["datatrace"] >= 1, what="own write seen")
    assert writes(kcd) == 1
    # a switch off updates it
    assert await asyncio.to_thread(trace, kcd, "off", f"{NS}/llama") == 0
    cm = await data_trace_cm(api)
    assert cm["data"] == {"profilingSwitch": OFF} and writes(kcd) == 2
    assert await kcd.brain.datatrace.get_switch(f"{NS}/llama") == json.loads(OFF)
    # a bad ConfigMap from outside: counted, the last good switch kept, nothing written back
    before = rejected(kcd, "datatrace_bad_switch")
    await put_labelled(api, NS, "data-trace-llama", {"profilingSwitch": "{not json"}, {"reset": "true"})
    await eventually(lambda: rejected(kcd, "datatrace_bad_switch") > before, what="bad JSON counted")
    assert await kcd.brain.datatrace.get_switch(f"{NS}/llama") == json.loads(OFF) and writes(kcd) == 2
    # the next change overwrites the corrupt value (the reference does)
    assert await asyncio.to_thread(trace, kcd, "on", "--light", f"{NS}/llama") == 0
    light = json.loads(ON) | {"CommunicationOperator": "off"}
    assert json.loads((await data_trace_cm(api))["data"]["profilingSwitch"]) == light
    # the job's deletion (its pods go) deletes the ConfigMap
    for p in ("llama-worker-0", "llama-worker-1"):
        await api._call("delete pod", api.core.delete_namespaced_pod, p, NS)
    await eventually(lambda: kcd.jobs.get(UID) is None, what="job removed")
    await eventually(lambda: _gone(api), what="data-trace-llama deleted")
    capsys.readouterr()


async def _gone(api) -> bool:
    return await data_trace_cm(api) is None


async def test_a_failed_write_answers_500_keeps_the_switch_and_is_retried(k8s, kcd, monkeypatch):
    emu, api = k8s
    await start_job(api, kcd)
    writer = component(kcd, "kube-control").dt_writer
    real, calls = writer.api.upsert_config_map, []

    async def failing_once(*a, **kw):
        calls.append(a)
        if len(calls) == 1:
            raise KubeError("patch configmap", 500, "injected")
        return await real(*a, **kw)

    monkeypatch.setattr(writer.api, "upsert_config_map", failing_once)
    with pytest.raises(DataTraceError) as err:
        await kcd.brain.datatrace.set_switch(f"{NS}/llama", json.loads(ON))
    assert err.value.code == 500 and f"failed to update comfigmap:[{NS}/llama]" in str(err.value)
    assert await kcd.brain.datatrace.get_switch(f"{NS}/llama") == json.loads(ON)  # stored, as the reference
    assert writes(kcd, "error") == 1
    cm = await eventually(lambda: data_trace_cm(api), timeout_s=15, what="retried write")
    assert cm["data"] == {"profilingSwitch": ON} and writes(kcd) == 1


async def test_a_follower_writes_no_data_trace_configmap(k8s, tmp_path):
    emu, api = k8s
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    cd1 = await kube_clusterd(tmp_path / "a", api.url, *ELECT)
    cd2 = None
    try:
        await eventually(lambda: kube(cd1).elector.leading.is_set(), what="first replica leads")
        cd2 = await kube_clusterd(tmp_path / "b", api.url, *ELECT)
        await start_job(api, cd2)
        await cd2.brain.datatrace.set_switch(f"{NS}/llama", json.loads(ON))  # the follower's detector
        assert not kube(cd2).elector.leading.is_set() and writes(cd2) == 0 and writes(cd2, "error") == 0
        await eventually(lambda: cd1.jobs.get(UID) is not None, what="leader knows the job")
        await cd1.brain.datatrace.set_switch(f"{NS}/llama", json.loads(OFF))  # the leader's
        assert (await data_trace_cm(api))["data"] == {"profilingSwitch": OFF}
        assert writes(cd1) == 1 and writes(cd2) == 0
    finally:
        for cd in (cd1, cd2):
            if cd is not None:
                await cd.stop()


async def test_with_the_writes_off_no_configmap_is_written(k8s, tmp_path):
    emu, api = k8s
    cd = await kube_clusterd(tmp_path, api.url, "--kube-data-trace-configmaps", "off")
    try:
        await start_job(api, cd)
        await cd.brain.datatrace.set_switch(f"{NS}/llama", json.loads(ON))
        assert component(cd, "kube-control").dt_writer is None
        assert await data_trace_cm(api) is None and writes(cd) == 0
    finally:
        await cd.stop()
