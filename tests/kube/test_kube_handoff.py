"""Volcano PodGroups and the rescheduling hand-off in Kubernetes mode (issue 15; clusterd.md §7.1,
§7.3, §6.5): a PodGroup with the reference's labels becomes a job with those settings; the brain's
decisions on its ranks produce the reference's reset-config, PodGroup-label and pod-label writes."""

from __future__ import annotations

import hashlib
import json
import time

import aiohttp
from brain.brainkit import Sims
from kube.kubekit import job_pod, kube_clusterd, podgroup
from support import eventually

from clusterd.brain.faultview import RankFault
from clusterd.kube import podgroups as pgs
from clusterd.kube.podgroups import read_settings
from faultmesh.kube import KubeError

NS = "train"
UID = "uid-job-1"
INITIAL = json.dumps({"RankList": [], "RetryTime": 0})


async def create_reset_cm(api, labels: dict | None = None) -> None:
    """The user's reset-config-llama ConfigMap (ClusterD updates it, never creates it)."""
    meta = {"name": "reset-config-llama", "namespace": NS, **({"labels": labels} if labels else {})}
    data = {"reset.json": INITIAL, "checkCode": hashlib.sha256(INITIAL.encode()).hexdigest()}
    await api.create_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})


async def reset_json(api) -> dict:
    cm = await api.get_config_map(NS, "reset-config-llama")
    text = cm["data"]["reset.json"]
    assert cm["data"]["checkCode"] == hashlib.sha256(text.encode()).hexdigest()
    return json.loads(text)


async def pg_label(api) -> str | None:
    doc = await api._call(
        "get pg", api.custom.get_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL, "llama-pg"
    )
    return (doc["metadata"].get("labels") or {}).get("process-recover-enable")


async def pod_labels(api, name) -> dict:
    doc = await api._call("get pod", api.core.read_namespaced_pod, name, NS)
    return doc["metadata"].get("labels") or {}


def rejected(cd, reason):
    return (
        cd.registry.get_sample_value(
            "faultmesh_rejected_requests_total", {"service": "kube", "reason": reason}
        )
        or 0
    )


async def test_podgroup_settings_and_the_handoff_writes(k8s, kcd):
    emu, api = k8s
    await api._call(
        "create pg", api.custom.create_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL,
        podgroup(
            {"process-recover-enable": "on", "fault-scheduling": "grace", "subHealthyStrategy": "graceExit"},
            {"recover-strategy": "retry,recover,bogus", "wait-reschedule-timeout": "60", "fault-retry-times": "3"},
        ),
    )  # fmt: skip
    # the pods say otherwise: the PodGroup wins
    pods = [
        job_pod("llama-worker-0", "node-1", 0, [0, 1], **{"recover-strategy": "dump"}),
        job_pod("llama-worker-1", "node-2", 1, [0, 1]),
    ]
    for p in pods:
        await api._call("create pod", api.core.create_namespaced_pod, NS, p)

    def configured():
        job = kcd.jobs.get(UID)
        return job if job is not None and len(job.ranks) == 4 and job.process_recover_enable == "on" else None

    job = await eventually(configured, what="job with the PodGroup's settings")
    assert job.recover_strategy == ("retry", "recover")
    assert (job.fault_scheduling, job.sub_healthy_strategy) == ("grace", "graceExit")
    assert "job-rescheduling" in job.rescheduling()
    assert job.extra.get("wait-reschedule-timeout") == "60" and job.extra.get("fault-retry-times") == "3"
    assert rejected(kcd, "bad_podgroup") >= 1  # "bogus" dropped, counted
    # a PodGroup change of only wait-reschedule-timeout re-applies the job
    await api.patch_custom(
        pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL, "llama-pg", {"metadata": {"annotations": {"wait-reschedule-timeout": "90"}}}
    )  # fmt: skip
    job = await eventually(
        lambda: (j := kcd.jobs.get(UID)) is not None and j.extra.get("wait-reschedule-timeout") == "90" and j,
        what="job with the new wait-reschedule-timeout",
    )
    assert job.extra.get("fault-retry-times") == "3" and job.recover_strategy == ("retry", "recover")
    # the user's reset-config (ClusterD updates it, never creates it)
    await create_reset_cm(api, labels={"reset": "true"})
    now = int(time.time() * 1000)
    hw = RankFault(1, "node-1", 1, 0, "80E18008", "RestartNPU", "1", now)
    sw = RankFault(2, "node-2", 0, 1, "", "RestartBusiness", "1", now)
    kcd.brain.decide(UID, "recovery", "stop-train", "hardware fault on the job's ranks", faults=[hw, sw])

    async def flushing():
        doc = await reset_json(api)
        return doc if doc.get("FaultFlushing") else None

    doc = await eventually(flushing, what="FaultFlushing=true")
    assert [r["RankId"] for r in doc["RankList"]] == [0, 1, 2, 3]  # every rank of each fault pod
    assert {r["Status"] for r in doc["RankList"]} == {"fault"}
    r1 = next(r for r in doc["RankList"] if r["RankId"] == 1)
    assert (r1["ErrorCodeHex"], r1["FaultLevel"], r1["Policy"]) == ("80E18008", "RestartNPU", "reset")
    assert doc["RetryTime"] == 0 and doc["RestartFaultProcess"] is False
    # the pod of the rank the training side reported: fault-type=software
    await eventually(
        lambda: _eq(pod_labels(api, "llama-worker-1"), "fault-type", "software"), what="fault pod labelled"
    )
    assert "fault-type" not in await pod_labels(api, "llama-worker-0")
    # exit-completed: RetryTime+1, RestartFaultProcess; PodGroup paused until it runs again
    kcd.brain.decide(UID, "recovery", "exit-completed", "rescheduled")

    async def restarted():
        doc = await reset_json(api)
        return doc if doc.get("RetryTime") == 1 else None

    doc = await eventually(restarted, what="RetryTime+1")
    assert doc["RestartFaultProcess"] is True
    await eventually(lambda: _is(pg_label(api), "pause"), what="process-recover-enable=pause")
    await api.patch_custom(
        pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL, "llama-pg", {"status": {"phase": "Running"}}
    )
    await eventually(lambda: _is(pg_label(api), "on"), what="process-recover-enable=on again")

    async def cleared():
        doc = await reset_json(api)
        return doc if not doc["RankList"] and not doc["RestartFaultProcess"] else None

    doc = await eventually(cleared, what="reset config cleared")
    assert doc["RetryTime"] == 1 and doc["FaultFlushing"] is False
    # a success removes the fault-pod labels
    kcd.brain.decide(UID, "recovery", "recover-success", "training side reported status 0")
    await eventually(lambda: _absent(pod_labels(api, "llama-worker-1"), "fault-type"), what="label removed")


async def test_absent_reset_config_is_counted_not_created(k8s, kcd):
    emu, api = k8s
    await api._call(
        "create pod", api.core.create_namespaced_pod, NS, job_pod("llama-worker-0", "node-1", 0, [0])
    )
    await eventually(lambda: kcd.jobs.get(UID), what="job")
    now = int(time.time() * 1000)
    kcd.brain.decide(
        UID,
        "recovery",
        "stop-train",
        "hw",
        faults=[RankFault(0, "node-1", 0, 0, "80E18008", "RestartNPU", "1", now)],
    )
    await eventually(
        lambda: kcd.registry.get_sample_value(
            "faultmesh_kube_writes_total", {"kind": "reset_config", "result": "absent"}
        ),
        what="absent counted",
    )
    try:
        await api.get_config_map(NS, "reset-config-llama")
        raise AssertionError("reset-config must not be created")
    except KubeError as e:
        assert e.status == 404


def test_bad_podgroup_values_are_dropped_with_reasons():
    settings, extra, problems = read_settings(
        podgroup(
            {"process-recover-enable": "maybe", "pod-rescheduling": "on"},
            {"wait-reschedule-timeout": "9999", "fault-retry-times": "-1", "recover-strategy": "recover"},
        )
    )
    assert settings == {"pod-rescheduling": "on", "recover-strategy": "recover"}
    assert extra == {"wait-reschedule-timeout": "270"}
    assert len(problems) == 3


async def _is(coro, value):
    return (await coro) == value


async def _eq(coro, key, value):
    return (await coro).get(key) == value


async def _absent(coro, key):
    return key not in await coro


async def pg_annotations(api) -> dict:
    doc = await api._call(
        "get pg", api.custom.get_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL, "llama-pg"
    )
    return doc["metadata"].get("annotations") or {}


async def test_platform_mode_annotations_live_on_the_podgroup(k8s, kcd):
    emu, api = k8s
    await api._call(
        "create pg", api.custom.create_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL,
        podgroup({"process-recover-enable": "on"}, {"recover-strategy": "recover", "ProcessRecoverStrategy": "recover"}),
    )  # fmt: skip
    await api._call(
        "create pod", api.core.create_namespaced_pod, NS, job_pod("llama-worker-0", "node-1", 0, [0])
    )
    await eventually(lambda: kcd.jobs.get(UID), what="job")
    plat = kcd.brain.platform
    await eventually(
        lambda: plat.get(UID).get("ProcessRecoverStrategy") == "recover", what="platform mode seen"
    )
    assert await plat.patch(UID, {"ProcessConfirmFault": "0:1"})
    assert plat.get(UID)["ProcessConfirmFault"] == "0:1"  # seen at once by the flow's next poll
    await eventually(
        lambda: _eq(pg_annotations(api), "ProcessConfirmFault", "0:1"), what="confirm on the PodGroup"
    )
    kcd.brain.decide(UID, "recovery", "recover-success", "status 0")  # CheckRecoverResult -> the annotation
    await eventually(
        lambda: _eq(pg_annotations(api), "ProcessRecoverStatus", "recover-success"),
        what="ProcessRecoverStatus",
    )
    assert (await pg_annotations(api))["recover-strategy"] == "recover"  # a merge patch: the rest stays


async def test_in_place_split_sets_restart_fault_process(k8s, kcd):
    emu, api = k8s
    await api._call(
        "create pod", api.core.create_namespaced_pod, NS, job_pod("llama-worker-0", "node-1", 0, [0])
    )
    await eventually(lambda: kcd.jobs.get(UID), what="job")
    await create_reset_cm(api)
    kcd.brain.decide(UID, "recovery", "in-place-split", "split", restart_process_pods=[0], restart_pods=[])

    async def flagged():
        doc = await reset_json(api)
        return doc if doc.get("RestartFaultProcess") else None

    await eventually(flagged, what="RestartFaultProcess=true")


async def test_in_place_split_rank_list_keeps_in_place_pods_own_ranks(k8s, kcd):
    """recover-in-place: pod 0 restarts its processes in place (its fault rank 0 only), pod 1
    restarts as a pod (every rank: 2 and 3) -- the reference's recoverInPlaceFaultAssociateSameNodeRank."""
    emu, api = k8s
    for p in (job_pod("llama-worker-0", "node-1", 0, [0, 1]), job_pod("llama-worker-1", "node-2", 1, [0, 1])):
        await api._call("create pod", api.core.create_namespaced_pod, NS, p)
    await eventually(lambda: (j := kcd.jobs.get(UID)) is not None and len(j.ranks) == 4, what="job")
    await create_reset_cm(api)
    now = int(time.time() * 1000)
    faults = [
        RankFault(0, "node-1", 0, 0, "80E01801", "RestartRequest", "1", now),
        RankFault(2, "node-2", 0, 1, "80E18008", "RestartNPU", "1", now),
    ]
    kcd.brain.decide(
        UID, "recovery", "in-place-split", "split", faults, restart_process_pods=[0], restart_pods=[1]
    )

    async def written():
        doc = await reset_json(api)
        return doc if doc.get("RestartFaultProcess") and doc["RankList"] else None

    doc = await eventually(written, what="RankList written")
    assert [(r["RankId"], r["ErrorCodeHex"]) for r in doc["RankList"]] == [
        (0, "80E01801"),
        (2, "80E18008"),
        (3, ""),
    ]


async def test_retry_report_labels_the_fault_pod_retry_fault(k8s, kcd):
    """A ReportProcessFault whose ranks are all retry types decides nothing by itself (its ranks
    become retry reports), yet the reference labels the reported rank's pod at the RPC:
    ``fault-type=retry-fault`` (fault_recover_service.go ReportProcessFault / getFaultReason)."""
    emu, api = k8s
    await api._call(
        "create pg", api.custom.create_namespaced_custom_object, pgs.GROUP, pgs.VERSION, NS, pgs.PLURAL,
        podgroup({"process-recover-enable": "on"}, {"recover-strategy": "retry"}),
    )  # fmt: skip
    for p in (job_pod("llama-worker-0", "node-1", 0, [0, 1]), job_pod("llama-worker-1", "node-2", 1, [0, 1])):
        await api._call("create pod", api.core.create_namespaced_pod, NS, p)
    await eventually(
        lambda: (j := kcd.jobs.get(UID)) is not None and j.process_recover_enable == "on", what="job"
    )
    sims = Sims(f"127.0.0.1:{kcd.grpc_port}")
    try:
        sim = await sims.start(UID, stop="silent")  # the retry flow stays at stopTrain: the label stays
        assert await sim.report_process_fault([("2", "0")]) == 0  # rank 2: node-2's pod, a UCE retry
        await eventually(
            lambda: _eq(pod_labels(api, "llama-worker-1"), "fault-type", "retry-fault"),
            what="retry-fault pod label",
        )
        assert "fault-type" not in await pod_labels(api, "llama-worker-0")
    finally:
        await sims.close()


async def test_a_bad_push_isolates_through_reset_config_only_up_to_the_breakers_share(k8s, tmp_path):
    """issue 30: a common code raised to SeparateNPU on every node makes the brain's fault list isolate
    every node of the job; the reset-config RankList (Policy isolate) names at most the breaker's share
    of the known nodes, the rest held (counted, path reset-config); a release writes them too."""
    emu, api = k8s
    nodes = [f"node-{i}" for i in range(4)]
    cd = await kube_clusterd(tmp_path, api.url, "--isolation-max-share", "0.5", "--isolation-window-s", "600")
    try:
        for i, n in enumerate(nodes):
            cd.nodes.hello(n, "", f"SN-{n}", "boot")
            await api._call(
                "create pod", api.core.create_namespaced_pod, NS, job_pod(f"llama-worker-{i}", n, i, [0])
            )
        await eventually(lambda: (j := cd.jobs.get(UID)) is not None and len(j.ranks) == 4, what="job")
        await create_reset_cm(api)
        now = int(time.time() * 1000)
        bad = [RankFault(i, n, 0, i, "80E18008", "SeparateNPU", "1", now) for i, n in enumerate(nodes)]
        cd.brain.decide(UID, "recovery", "stop-train", "table push: 80E18008 SeparateNPU", faults=bad)

        async def ranks(want: int):
            doc = await reset_json(api)
            got = [r["RankId"] for r in doc["RankList"] if r["Policy"] == "isolate"]
            return got if len(got) == want else None

        assert await eventually(lambda: ranks(2), what="two nodes' ranks isolated") == [0, 1]
        held = {"path": "reset-config"}
        assert cd.registry.get_sample_value("faultmesh_isolations_held_total", held) == 2
        assert cd.registry.get_sample_value("faultmesh_isolation_breaker_open") == 1
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{cd.http.port}/v1/release/breaker"
            async with s.post(url, json={"by": "alice", "reason": "checked: the chips are bad"}) as r:
                assert r.status == 200 and (await r.json())["released"] == ["node-2", "node-3"]
        assert await eventually(lambda: ranks(4), what="the held ranks written after the release") == [
            0,
            1,
            2,
            3,
        ]
        assert cd.registry.get_sample_value("faultmesh_isolation_breaker_open") == 0
    finally:
        await cd.stop()
