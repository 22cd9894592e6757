"""The reference's control ConfigMaps on the Kubernetes emulator (issue 15; fdol.md §3, §7,
clusterd.md §3, §7.3): ``ras-feature-slownode-<job>`` starts and stops slow-node detection,
``data-trace-<job>`` switches tracing as the gRPC service does, clusterd writes ``fault-job-info``
as the reference does; bad ConfigMaps are refused and counted."""

from __future__ import annotations

import json

from kube.kubekit import job_pod
from kube.test_fault_config_cms import put_cm
from support import eventually

from clusterd.brain.datatrace import switch_path
from faultmesh.kube import KubeError

NS = "train"
UID = "uid-job-1"


def featconf(**kw) -> str:
    doc = {"jobName": "llama", "jobNamespace": NS, "normalNumber": 20, "nSigma": 3,
           "degradationPercentage": 0.3, "nConsecAnomaliesSignifySlow": 3, "nSecondsDoOneDetection": 30,
           "clusterMeanDistance": 1.3, "cardOneNode": 16, "SlowNode": 1}  # fmt: skip
    for k in kw:  # another spelling of a key replaces it (keys are case-insensitive)
        doc = {d: v for d, v in doc.items() if d.lower() != k.lower()}
    doc.update(kw)
    return json.dumps(doc)


def slownode_cm(text: str | None = None, **data) -> tuple[str, dict]:
    return "ras-feature-slownode-llama", ({"FeatConf": text} if text is not None else {}) | data


def rejected(cd, reason: str) -> float:
    v = cd.registry.get_sample_value(
        "faultmesh_rejected_requests_total", {"service": "kube", "reason": reason}
    )
    return v or 0.0


def component(cd, name: str):
    return next(c for c in cd.components if getattr(c, "name", "") == name)


async def put_labelled(api, ns: str, name: str, data: dict, labels: dict) -> None:
    await put_cm(api, ns, name, data)
    await api.patch_config_map(ns, name, {"metadata": {"labels": labels}})


async def start_job(api, cd) -> None:
    for p in (job_pod("llama-worker-0", "node-1", 0, [0, 1]), job_pod("llama-worker-1", "node-2", 1, [0, 1])):
        await api._call("create pod", api.core.create_namespaced_pod, NS, p)
    await eventually(
        lambda: cd.jobs.get(UID) is not None and len(cd.jobs.get(UID).ranks) == 4, what="job known"
    )


LABEL = {"fd-ol-slow-node": "true"}


async def test_ras_feature_slownode_configmap_starts_and_stops_detection(k8s, kcd):
    emu, api = k8s
    sn = component(kcd, "slownode")
    control = component(kcd, "kube-control")  # the control ConfigMaps (clusterd.kube.control)
    await eventually(lambda: control.slownode_synced.is_set(), what="first list")
    # applied before the job exists: it waits, and starts once the pods make the job known
    name, data = slownode_cm(featconf())
    await put_labelled(api, "mindx-dl", name, data, LABEL)
    await eventually(lambda: control.pending, what="waiting for its job")
    assert sn.jobs == {}
    await start_job(api, kcd)
    js = await eventually(lambda: sn.jobs.get("llama"), what="detection started")
    assert js.source == "kube" and js.placement == {0: "node-1", 1: "node-1", 2: "node-2", 3: "node-2"}
    assert (js.conf.job_namespace, js.conf.n_seconds) == (NS, 30.0)
    # a changed threshold applies; SlowNode 0 stops it; 1 starts it again
    await put_labelled(api, "mindx-dl", name, {"FeatConf": featconf(nSigma=2)}, LABEL)
    await eventually(
        lambda: sn.jobs.get("llama") is not None and sn.jobs["llama"].conf.n_sigma == 2.0, what="updated"
    )
    await put_labelled(api, "mindx-dl", name, {"FeatConf": featconf(SlowNode=0)}, LABEL)
    await eventually(lambda: "llama" not in sn.jobs, what="stopped by SlowNode 0")
    await put_labelled(api, "mindx-dl", name, {"FeatConf": featconf(slowNode=1)}, LABEL)  # any key case
    await eventually(lambda: "llama" in sn.jobs, what="started again")
    # bad versions are refused and counted; the detection in force stays
    bad = [
        ({"FeatConf": featconf()[:40]}, "slownode_bad_featconf"),  # truncated
        ({"FeatConf": featconf(nSigma="three")}, "slownode_bad_featconf"),  # wrong type
        ({"FeatConf": featconf(clusterMeanDistance=0.5)}, "slownode_bad_featconf"),  # out of range
        ({"FeatConf": featconf(), "Extra": "1"}, "slownode_unknown_key"),
        ({"FeatConf": "{" + " " * 70_000 + "}"}, "slownode_bad_value"),  # huge
        ({"FeatConf": featconf(bogus=1)}, "slownode_featconf_unknown_keys"),  # ignored, as the reference
        ({"featconf": featconf()}, "slownode_unknown_key"),
    ]
    for data, reason in bad:
        before = rejected(kcd, reason)
        await put_labelled(api, "mindx-dl", name, data, LABEL)
        await eventually(lambda r=reason, b=before: rejected(kcd, r) > b, what=f"{reason} counted")
        assert "llama" in sn.jobs and sn.jobs["llama"].conf.n_sigma == 3.0
    assert rejected(kcd, "slownode_no_featconf") == 1  # the last one also has no FeatConf key
    # without the label it is not a control ConfigMap: the detection stops as on delete
    await api.patch_config_map("mindx-dl", name, {"metadata": {"labels": {"fd-ol-slow-node": None}}})
    await eventually(lambda: "llama" not in sn.jobs, what="stopped when unlabelled")
    await put_labelled(api, "mindx-dl", name, {"FeatConf": featconf()}, LABEL)
    await eventually(lambda: "llama" in sn.jobs, what="started")
    await api.delete_config_map("mindx-dl", name)
    await eventually(lambda: "llama" not in sn.jobs, what="stopped by delete")


SWITCH = {
    "CommunicationOperator": "off",
    "Step": "on",
    "SaveCheckpoint": "on",
    "FP": "on",
    "DataLoader": "on",
}


async def test_data_trace_configmap_switches_tracing(k8s, kcd):
    emu, api = k8s
    await start_job(api, kcd)
    label = {"reset": "true"}
    await put_labelled(api, NS, "data-trace-llama", {"profilingSwitch": json.dumps(SWITCH)}, label)
    dt = kcd.brain.datatrace
    await eventually(lambda: dt.get_switch(f"{NS}/llama"), what="switch set")
    assert await dt.get_switch(f"{NS}/llama") == SWITCH
    # the same effect as ModifyTrainingDataTraceSwitch: the switch file the containers mount
    path = switch_path(dt.root, NS, "llama")
    assert json.loads(path.read_text()) == SWITCH
    # kubectl edit: CommunicationOperator on; an omitted field becomes ""
    on = {**SWITCH, "CommunicationOperator": "on"}
    del on["DataLoader"]
    await put_labelled(api, NS, "data-trace-llama", {"profilingSwitch": json.dumps(on)}, label)
    await eventually(lambda: json.loads(path.read_text())["CommunicationOperator"] == "on", what="edited")
    assert json.loads(path.read_text()) == {**on, "DataLoader": ""}
    # bad versions: refused, counted, the switch stays
    for data, reason in [
        ({"profilingSwitch": json.dumps(SWITCH)[:30]}, "datatrace_bad_switch"),
        ({"profilingSwitch": json.dumps({**SWITCH, "Step": 1})}, "datatrace_bad_switch"),
        ({"profilingSwitch": json.dumps(["on"])}, "datatrace_bad_switch"),
        ({"profilingSwitch": json.dumps(on), "other": "x"}, "datatrace_unknown_key"),  # the key is refused
        ({"profilingSwitch": "{" + " " * 70_000 + "}"}, "datatrace_bad_value"),
    ]:
        before = rejected(kcd, reason)
        await put_labelled(api, NS, "data-trace-llama", data, label)
        await eventually(lambda r=reason, b=before: rejected(kcd, r) > b, what=f"{reason} counted")
        assert json.loads(path.read_text()) == {**on, "DataLoader": ""}
    # a data-trace ConfigMap of a job clusterd does not know waits for it (nothing written)
    await put_labelled(api, NS, "data-trace-other", {"profilingSwitch": json.dumps(SWITCH)}, label)
    await eventually(
        lambda: ("datatrace", f"{NS}/data-trace-other") in component(kcd, "kube-control").pending, what="wait"
    )
    assert await dt.get_switch(f"{NS}/other") is None


async def fault_job_info(api) -> dict | None:
    try:
        return (await api.get_config_map("cluster-system", "fault-job-info")).get("data") or {}
    except KubeError as e:
        if e.status == 404:
            return None
        raise


async def test_fault_job_info_written_for_an_a3_job_and_cleared(k8s, kcd):
    emu, api = k8s
    await start_job(api, kcd)
    control = component(kcd, "kube-control")
    control.release_s = 0.05
    sdids = {"node-1": [10, 11, 12, 13], "node-2": [20, 21, 22, 23]}
    control.topology = lambda node: (7, sdids[node]) if node in sdids else None
    fault = {"rank": 1, "node": "node-1", "device_id": 1, "code": "80E18008", "level": "RestartNPU"}
    assert control.on_decision in kcd.brain.decision_log.listeners
    control.on_decision(UID, {"decision": "stop-train", "faults": [fault]})
    data = await eventually(lambda: fault_job_info(api), what="fault-job-info written")
    value = data[UID]
    doc = json.loads(value)
    t = doc["7"]["FaultTimes"]
    # Go's json.Marshal of map[int]SuperPodFaultInfos: struct fields in order, map keys sorted
    assert value == (
        '{"7":{"SdIds":["10","11","12","13"],"FaultNodes":{"node-1":{}},"NodeNames":["node-2"],'
        f'"FaultTimes":{t},"JobId":"{UID}"}}}}'
    )
    # recovered: removed (after the release delay)
    control.on_decision(UID, {"decision": "recover-success"})
    await eventually(lambda: fault_job_info_has(api, UID, False), what="cleared after recover")
    # a job outside any super pod (not A3): nothing written
    control.topology = lambda node: None
    done = control.processed
    control.on_decision(UID, {"decision": "stop-train", "faults": [fault]})
    await eventually(lambda: control.processed > done, what="decision handled")
    assert await fault_job_info_has(api, UID, False)
    control.topology = lambda node: (7, sdids[node])
    control.on_decision(
        UID, {"decision": "pre-exit", "faults": [fault, {**fault, "node": "node-2", "rank": 2}]}
    )
    data = await eventually(lambda: fault_job_info_has(api, UID, True), what="written again")
    doc = json.loads(data[UID])["7"]
    assert doc["FaultNodes"] == {"node-1": {}, "node-2": {}} and doc["NodeNames"] is None
    assert doc["SdIds"] == ["10", "11", "12", "13", "20", "21", "22", "23"]
    # the job goes: its entry goes
    for p in ("llama-worker-0", "llama-worker-1"):
        await api._call("delete pod", api.core.delete_namespaced_pod, p, NS)
    await eventually(lambda: fault_job_info_has(api, UID, False), what="cleared with the job")


async def fault_job_info_has(api, job_id: str, present: bool):
    data = await fault_job_info(api)
    if data is None:
        return not present
    if (job_id in data) != present:
        return None
    return data if present else True


async def _nodes(api) -> None:
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})


async def test_a_slownode_job_whose_configmap_went_during_a_restart_stops(k8s, tmp_path):
    from kube.kubekit import kube_clusterd

    emu, api = k8s
    await _nodes(api)
    cd = await kube_clusterd(tmp_path, api.url)
    try:
        await start_job(api, cd)
        await put_labelled(api, "mindx-dl", "ras-feature-slownode-llama", {"FeatConf": featconf()}, LABEL)
        await eventually(lambda: "llama" in component(cd, "slownode").jobs, what="detection started")
    finally:
        await cd.stop()
    await api.delete_config_map("mindx-dl", "ras-feature-slownode-llama")
    cd = await kube_clusterd(tmp_path, api.url)
    try:
        await eventually(lambda: component(cd, "kube-control").slownode_synced.is_set(), what="first list")
        assert "llama" not in component(cd, "slownode").jobs  # resumed from the store, then stopped
    finally:
        await cd.stop()


async def test_an_applied_data_trace_configmap_does_not_undo_a_later_grpc_change(k8s, tmp_path):
    from kube.kubekit import kube_clusterd

    emu, api = k8s
    await _nodes(api)
    grpc_switch = {**{f: "off" for f in SWITCH}, "CommunicationOperator": "on"}
    cd = await kube_clusterd(tmp_path, api.url)
    try:
        await start_job(api, cd)
        await put_labelled(
            api, NS, "data-trace-llama", {"profilingSwitch": json.dumps(SWITCH)}, {"reset": "true"}
        )
        await eventually(lambda: cd.brain.datatrace.get_switch(f"{NS}/llama"), what="switch set")
        await cd.brain.datatrace.set_switch(f"{NS}/llama", grpc_switch)  # as ModifyTrainingDataTraceSwitch
    finally:
        await cd.stop()
    cd = await kube_clusterd(tmp_path, api.url)
    try:
        control = component(cd, "kube-control")
        await eventually(lambda: control.handled["datatrace"] >= 1 and not control.pending, what="handled")
        assert await cd.brain.datatrace.get_switch(f"{NS}/llama") == grpc_switch
        # an edit of the ConfigMap applies again
        edited = {**SWITCH, "FP": "off"}
        await put_labelled(
            api, NS, "data-trace-llama", {"profilingSwitch": json.dumps(edited)}, {"reset": "true"}
        )
        await eventually(lambda: control.handled["datatrace"] >= 2, what="edit handled")
        assert await cd.brain.datatrace.get_switch(f"{NS}/llama") == edited
    finally:
        await cd.stop()


async def test_fault_job_info_written_before_a_restart_is_cleared_on_recovery(k8s, tmp_path):
    from kube.kubekit import kube_clusterd

    emu, api = k8s
    await _nodes(api)
    before = '{"7":{"SdIds":["10"],"FaultNodes":{"node-1":{}},"NodeNames":null,"FaultTimes":1,"JobId":"uid-job-1"}}'
    await put_cm(api, "cluster-system", "fault-job-info", {UID: before, "other-job": "{}"})
    cd = await kube_clusterd(tmp_path, api.url)
    try:
        await start_job(api, cd)
        control = component(cd, "kube-control")
        control.release_s = 0.05
        await eventually(lambda: UID in control.written, what="read back at start")
        control.on_decision(UID, {"decision": "recover-success"})
        data = await eventually(lambda: fault_job_info_has(api, UID, False), what="cleared after recover")
        assert (await fault_job_info(api)) == {"other-job": "{}"} and data
        await control.refresh()  # the hourly refresh: entries of jobs clusterd does not know go
        assert await fault_job_info(api) == {}
    finally:
        await cd.stop()
