"""clusterd as two replicas against one Kubernetes emulator (issue 15 HA).

Two real ``clusterd --kube --kube-leader-elect on`` processes share a Lease and the state ConfigMap;
agents and PubFault senders are connected through both addresses (as through a Service: the
follower refuses, the client tries the next). The leader is killed with SIGKILL: the follower must
lead within 15 s holding every acked public fault, the job and its recovery settings and the
data-trace switch, and every history row and decision of the old leader's last history-mirror write
(issue 30); before, it refused gRPC (UNAVAILABLE naming the leader) and mutating HTTP (503).
Then the state ConfigMap's bad input: API errors retried and counted, corrupt documents rejected.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request

import grpc
import kmock
import pytest
from kube.kubekit import kube_clusterd
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import ClusterdProcess, eventually, public_request

from clusterd.kube import cmdoc, hahistory
from clusterd.kube.hastate import KubeState, MirroredStore, StateMetrics, StateWriteError, encode, pack
from faultmesh._pb import profiling_pb2, profiling_pb2_grpc, pubfault_pb2_grpc, recover_pb2, recover_pb2_grpc
from faultmesh.agent import AgentClient, AgentState, split_targets
from faultmesh.kube import KubeApi
from faultmesh.model import Fault
from fmtools.trainsim import TrainSim

NS = "faultmesh"
STATE_CM = "faultmesh-clusterd-state"
LEASE_S = 8  # the chart's value
JOB = {
    "id": "job-ha",
    "name": "llama",
    "namespace": "default",
    "status": "running",
    "framework": "pytorch",
    "recover-strategy": "retry,recover,dump",
    "process-recover-enable": "on",
    "fault-scheduling": "grace",
    "ranks": [{"rank": 0, "node": "node-1", "device": 0}, {"rank": 1, "node": "node-2", "device": 0}],
}


def _http(method: str, url: str, body=None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


async def http(method: str, url: str, body=None) -> tuple[int, object]:
    """One HTTP call in a thread (the emulator shares this event loop: never block it)."""
    return await asyncio.to_thread(_http, method, url, body)


async def readyz(p: ClusterdProcess) -> tuple[int, object]:
    return await http("GET", p.url("/readyz"))


class Senders:
    """PubFault senders in threads: each faultId retried over both addresses until answered 0."""

    def __init__(self, targets: list[str], n: int = 2) -> None:
        self.targets = targets
        self.stop = threading.Event()
        self.acked: set[str] = set()
        self.refusals: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(f"s{i}",), daemon=True) for i in range(n)]

    def _run(self, prefix: str) -> None:
        chans = [grpc.insecure_channel(t) for t in self.targets]
        stubs = [pubfault_pb2_grpc.PubFaultStub(c) for c in chans]
        i = turn = 0
        try:
            while not self.stop.is_set():
                fid = f"{prefix}-{i:05d}"
                while not self.stop.is_set():
                    try:
                        code = (
                            stubs[turn].SendPublicFault(public_request(fid, node="node-pub"), timeout=2).code
                        )
                    except grpc.RpcError as e:
                        code = -1
                        if e.code() == grpc.StatusCode.UNAVAILABLE and "follower" in (e.details() or ""):
                            with self.lock:
                                self.refusals.append(e.details())
                    if code == 0:
                        with self.lock:
                            self.acked.add(fid)
                        break
                    turn = (turn + 1) % len(stubs)
                    time.sleep(0.05)
                i += 1
                time.sleep(0.1)  # each ack is a state ConfigMap write: the emulator shares our loop
        finally:
            for c in chans:
                c.close()

    def __enter__(self) -> Senders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


async def public_ids(p: ClusterdProcess) -> set[str]:
    status, faults = await http("GET", p.url("/v1/faults?node=node-pub"))
    assert status == 200, faults
    return {f["attributes"].get("faultId", "") for f in faults} - {""}


async def metric(p: ClusterdProcess, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels`` on ``p``'s /metrics (0 when none)."""
    status, text = await http("GET", p.url("/metrics"))
    assert status == 200
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


async def _ready(p: ClusterdProcess) -> bool:
    return (await readyz(p))[0] == 200


async def _has_code(p: ClusterdProcess, node: str, code: str) -> bool:
    status, faults = await http("GET", p.url(f"/v1/faults?node={node}"))
    return status == 200 and any(f["code"] == code for f in faults)


HISTORY_CM = f"{STATE_CM}-history"
EVENT_KEYS = ("ts_ms", "kind", "node", "device_type", "device_id", "code", "source", "level", "assertion",
              "attributes")  # fmt: skip


def row_key(row: list) -> tuple:
    return (*row[:-1], json.dumps(row[-1], sort_keys=True))


async def history_doc(api) -> dict:
    """The history mirror's document as the API server holds it."""
    return hahistory.decode(await api.get_config_map(NS, HISTORY_CM))


async def mirrored(api, public_occurs: int) -> bool:
    """The history ConfigMap holds the agent's occur, ``public_occurs`` public ones and a decision."""
    try:
        doc = await history_doc(api)
    except Exception:  # not written yet
        return False
    sources = [r[6] for r in doc["events"] if r[1] == "occur"]
    return (
        "noded" in sources
        and sum(s.startswith("public") for s in sources) >= public_occurs
        and bool(doc["decisions"])
    )


def replica(tmp_path, name: str, url: str) -> ClusterdProcess:
    flags = ["--kube", "--kube-api", url, "--kube-leader-elect", "on", "--kube-lease-namespace", NS,
             "--kube-lease-s", str(LEASE_S), "--kube-timeout-s", "4", "--kube-min-write-s", "0.05",
             "--public-fault-qps", "100000", "--public-fault-burst", "100000"]  # fmt: skip
    return ClusterdProcess(tmp_path / name / "state", flags, log_path=tmp_path / f"{name}.log")


async def test_leader_killed_follower_leads_with_acked_state(k8s, tmp_path):
    emu, api = k8s
    for n in ("node-1", "node-2"):
        await api.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
    a, b = replica(tmp_path, "a", api.url), replica(tmp_path, "b", api.url)
    agent = None
    try:
        await asyncio.to_thread(a.start, "/readyz")  # the first replica leads
        await asyncio.to_thread(b.start, "/healthz")
        status, why = await readyz(b)
        assert status == 503 and "follower" in str(why)

        async def knows_leader() -> bool:  # until its first Lease read (2 s retry) it says "unknown"
            return "leader: unknown" not in str((await readyz(b))[1])

        await eventually(knows_leader, timeout_s=15, what="the follower to read the Lease")

        # The follower refuses: gRPC UNAVAILABLE naming the leader, mutating HTTP 503, reads answer.
        async with grpc.aio.insecure_channel(b.grpc) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pubfault_pb2_grpc.PubFaultStub(ch).SendPublicFault(
                    public_request("f-x", node="node-pub")
                )
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        lease = await api._call("get", api.coordination.read_namespaced_lease, "faultmesh-clusterd", NS)
        assert lease["spec"]["holderIdentity"] in e.value.details()
        status, out = await http("POST", b.url("/v1/jobs"), [JOB])
        assert status == 503 and out["error"] == "follower"
        assert (await http("GET", b.url("/healthz")))[0] == 200
        assert (await http("GET", b.url("/metrics")))[0] == 200
        assert (await http("GET", b.url("/v1/faults")))[0] == 503  # a standby holds no state

        # State on the leader: a job with its recovery settings, a data-trace switch, an agent.
        status, out = await http("POST", a.url("/v1/jobs"), [JOB])
        assert status == 200, out
        job_before = (await http("GET", a.url("/v1/jobs/job-ha")))[1]
        async with grpc.aio.insecure_channel(a.grpc) as ch:
            r = await profiling_pb2_grpc.TrainingDataTraceStub(ch).ModifyTrainingDataTraceSwitch(
                profiling_pb2.DataTypeReq(
                    jobNsName="default/llama", profilingSwitch=profiling_pb2.ProfilingSwitch(Step="on")
                )
            )
            init = await recover_pb2_grpc.RecoverStub(ch).Init(
                recover_pb2.ClientInfo(jobId="job-ha", role="taskd")
            )
        assert init.code == 0
        state = AgentState("node-1")
        state.upsert(Fault("noded", "node-1", "CPU", 0, "00000001", "SeparateFault"))
        agent = AgentClient(f"{b.grpc},{a.grpc}", "node-1", "noded", state=state, backoff_max_s=1.0)
        await agent.start()
        await agent.wait_synced(20)  # refused by the follower first, then the leader acked

        # API errors meanwhile: the leader's next Lease renewal gets 429 (retried, counted; it
        # keeps the Lease) and the new leader's first ConfigMap watches get 410 Gone (re-listed).
        renewals = emu[kmock.action.UPDATE, kmock.resource("coordination.k8s.io/v1/leases")]
        n = len(renewals)
        renewals[n : n + 1] << 429
        watches = emu[kmock.action.WATCH, kmock.resource("v1/configmaps")]
        n = len(watches)
        watches[n : n + 2] << (
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}},
        )
        await eventually(
            lambda: metric(a, "faultmesh_kube_lease_errors_total", status="429"), what="429 counted"
        )

        with Senders([b.grpc, a.grpc]) as senders:
            await eventually(lambda: len(senders.acked) >= 20, timeout_s=30, what="public faults acked")
            assert senders.refusals  # the follower turned senders away
            assert await metric(a, "faultmesh_clusterd_leader") == 1
            # mid-flow: the history mirror holds public occurs and the job's decisions, more coming
            await eventually(lambda: mirrored(api, 10), timeout_s=30, what="history mirrored")
            a.kill9()
            t_kill = time.monotonic()
            last = await history_doc(api)  # the old leader's last mirror write (b leads >= 8 s later)
            await eventually(lambda: _ready(b), timeout_s=30, what="follower leads")
            took = time.monotonic() - t_kill
            await eventually(lambda: len(senders.acked) >= 40, timeout_s=30, what="new leader acks")
        assert took < 15, f"the follower took {took:.1f} s to lead"

        missing = senders.acked - await public_ids(b)
        assert not missing, f"{len(missing)} acked public faults lost: {sorted(missing)[:5]}"
        job_after = (await http("GET", b.url("/v1/jobs/job-ha")))[1]
        for k in ("id", "name", "namespace", "status", "framework", "recover-strategy",
                  "process-recover-enable", "fault-scheduling"):  # fmt: skip
            assert job_after.get(k) == job_before.get(k), (k, job_before, job_after)
        async with grpc.aio.insecure_channel(b.grpc) as ch:
            r = await profiling_pb2_grpc.TrainingDataTraceStub(ch).GetTrainingDataTraceSwitch(
                profiling_pb2.DataStatusReq(jobNsName="default/llama")
            )
            # TaskD's manager does not call Init again after a reconnect: its Init survived the failover
            reg = await recover_pb2_grpc.RecoverStub(ch).Register(
                recover_pb2.ClientInfo(jobId="job-ha", role="taskd")
            )
        assert r.profilingSwitch.Step == "on"
        assert reg.code == 0, reg.info
        assert await metric(b, "faultmesh_clusterd_leader") == 1
        assert await metric(b, "faultmesh_kube_watch_restarts_total", why="expired") >= 1
        # Failover keeps the record: every history row and decision of the old leader's last mirror
        # write is in the new leader's /v1/events and decision log.
        status, rows = await http("GET", b.url("/v1/events?limit=100000"))
        assert status == 200, rows
        have = {row_key([r[k] for k in EVENT_KEYS]) for r in rows}
        lost = [r for r in last["events"] if row_key(r) not in have]
        assert not lost, f"{len(lost)} of {len(last['events'])} history rows lost: {lost[:3]}"
        decisions = (await http("GET", b.url("/v1/jobs/job-ha/recovery")))[1]["decisions"]
        mirrored_decisions = [rec for job, rec in last["decisions"] if job == "job-ha"]
        assert mirrored_decisions == decisions[: len(mirrored_decisions)]
        await eventually(  # and the new leader mirrors on (its own metrics on /metrics)
            lambda: metric(b, "faultmesh_kube_history_writes_total", result="ok"), what="b's history write"
        )
        # The agent reconnected to the new leader and its snapshot is back.
        await eventually(
            lambda: _has_code(b, "node-1", "00000001"),
            timeout_s=20,
            what="agent snapshot at the new leader",
        )
    finally:
        if agent is not None:
            await agent.stop()
        for p in (a, b):
            await asyncio.to_thread(p.stop)


# -- the state ConfigMap's bad input (in process, against the same emulator) ------------------------


def state_of(api, leading=lambda: True, **kw) -> tuple[KubeState, StateMetrics]:
    m = StateMetrics(CollectorRegistry())
    api = KubeApi(api.api_client, timeout_s=1)
    return KubeState(api, NS, STATE_CM, "me", leading, m, write_s=kw.pop("write_s", 8.0), **kw), m


def count(metric, **labels) -> float:
    return metric.labels(**labels)._value.get()


async def test_api_errors_on_the_state_configmap_are_retried_and_counted(k8s, tmp_path):
    emu, api = k8s
    st, m = state_of(api)
    store = MirroredStore(st, tmp_path / "s")
    await store.open()
    try:
        cm = kmock.resource("v1/configmaps")
        emu[kmock.action.CREATE, cm][:1] << 429  # the first create of the state ConfigMap
        await store.kv_put("jobs", "j1", {"id": "j1"})

        async def slow():
            await asyncio.sleep(2.5)  # past the client's timeout (the client gives up: a timeout)
            return {}

        updates = emu[kmock.action.UPDATE, cm, kmock.name(STATE_CM)]  # slices count its requests
        updates[0:1] << 409
        updates[1:2] << slow
        updates[2:3] << 503
        await store.put_separation("node-1", 3, "80E18008", 1, 2)
        for reason in ("throttled", "conflict", "timeout", "server"):
            assert count(m.retries, reason=reason) >= 1, reason
        again, _ = state_of(api)
        assert await again.load() == 2  # both changes are in the ConfigMap
        assert again.kv["jobs"]["j1"] == {"id": "j1"} and again.seps[("node-1", 3)][2] == "80E18008"
    finally:
        await store.close()


async def test_a_change_that_cannot_be_written_is_refused_and_not_kept(k8s, tmp_path):
    emu, api = k8s
    leading = [True]
    st, m = state_of(api, leading=lambda: leading[0], max_bytes=2000, write_s=1.0)
    store = MirroredStore(st, tmp_path / "s")
    await store.open()
    try:
        await store.kv_put("datatrace", "default/llama", {"Step": "on"})
        with pytest.raises(StateWriteError, match="full"):
            await store.kv_put("jobs", "big", {"blob": os.urandom(4000).hex()})
        assert count(m.rejected, reason="too large") == 1
        assert await store.kv_get("jobs", "big") is None and "jobs" not in st.kv
        emu[kmock.action.UPDATE, kmock.resource("v1/configmaps"), kmock.name(STATE_CM)] << 500
        with pytest.raises(StateWriteError, match="failed"):
            await store.write_faults(
                [(Fault("pubfault", "n", "NPU", 0, "010001001", "SubHealthFault"), "public")]
            )
        assert not st.faults and await store.load_faults() == []
        leading[0] = False
        with pytest.raises(StateWriteError, match="not the leader"):
            await store.put_separation("n", 0, "c", 1, 1)
        await store.kv_put("decisions", "j", [1])  # not mirrored: SQLite only, no API call
    finally:
        await store.close()


EMPTY = {"version": 1, "faults": [], "kv": {}, "separations": []}
GOOD = encode(EMPTY)
BLOB = GOOD["binaryData"]["state.json.gz"]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"data": {"sha256": "0" * 64}}, "missing key"),
        ({"data": GOOD["data"], "binaryData": {"state.json.gz": "%%not base64%%"}}, "bad encoding"),
        ({"data": GOOD["data"], "binaryData": {"state.json.gz": base64.b64encode(base64.b64decode(BLOB)[:-9]).decode()}}, "bad encoding"),
        ({"data": {"sha256": "0" * 64}, "binaryData": GOOD["binaryData"]}, "checksum mismatch"),
        (pack(b'{"version": 1, "faults": [tru'), "bad JSON"),
        (encode({"version": 7}), "unknown version"),
        (encode({"version": 1, "faults": {}, "kv": {}, "separations": []}), "bad shape"),
        (pack(b" " * 100_000), "too large"),  # inflates past the limit (set to 64 KiB here)
    ],
    ids=["missing-key", "not-base64", "truncated", "checksum", "bad-json", "version", "shape", "huge"],
)  # fmt: skip
async def test_a_corrupt_state_configmap_is_rejected_not_a_crash(k8s, tmp_path, monkeypatch, fields, reason):
    monkeypatch.setattr(cmdoc, "MAX_RAW_BYTES", 64 << 10)
    emu, api = k8s
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": STATE_CM, "namespace": NS},
        **fields,
    }
    await api.create_config_map(NS, body)
    st, m = state_of(api)
    store = MirroredStore(st, tmp_path / "s")
    await store.open()  # no crash: an empty state
    try:
        assert count(m.rejected, reason=reason) == 1
        assert await store.load_faults() == [] and not st.kv
        kept = await api.get_config_map(NS, f"{STATE_CM}-rejected")
        assert reason in kept["data"]["rejected-reason"]
        assert kept.get("binaryData", {}) == fields.get("binaryData", {})  # kept for the operator
        await store.kv_put("jobs", "j", {"id": "j"})  # the leader goes on and writes a good one
        again, _ = state_of(api)
        assert await again.load() == 1
    finally:
        await store.close()


async def test_a_bad_record_is_skipped_and_the_rest_restored(k8s, tmp_path):
    emu, api = k8s
    good = [
        "node-1",
        "NPU",
        0,
        "010001001",
        "pubfault",
        "SubHealthFault",
        "occur",
        1,
        2,
        {"faultId": "f1"},
        "public",
    ]
    doc = {"version": 1, "faults": [good, ["short"]], "kv": {"jobs": {"j": {"id": "j"}}},
           "separations": [["node-1", 1, "c", 1, 2], [None, 1, "c", 1, 2]]}  # fmt: skip
    meta = {"name": STATE_CM, "namespace": NS}
    await api.create_config_map(
        NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **encode(doc)}
    )
    st, m = state_of(api)
    store = MirroredStore(st, tmp_path / "s")
    await store.open()
    try:
        assert count(m.rejected, reason="bad record") == 2
        faults = await store.load_faults()
        assert [(f.code, o) for f, o in faults] == [("010001001", "public")]
        assert await store.kv_get("jobs", "j") == {"id": "j"}
        assert await store.load_separations() == [("node-1", 1, "c", 1, 2)]
    finally:
        await store.close()


# -- in process: the gate inside ClusterD, trainsim and agents retrying until the leader answers ----


def test_agent_targets_split_on_commas_but_not_a_grpc_scheme():
    assert split_targets("a:1,b:2") == ["a:1", "b:2"]
    assert split_targets("a:1") == ["a:1"]
    assert split_targets("ipv4:127.0.0.1:1,127.0.0.1:2") == ["ipv4:127.0.0.1:1,127.0.0.1:2"]
    assert split_targets("dns:///clusterd-grpc-svc:8899") == ["dns:///clusterd-grpc-svc:8899"]


async def test_a_follower_clusterd_refuses_and_trainsim_reaches_it_once_it_leads(k8s, tmp_path):
    emu, api = k8s
    elect = ("--kube-leader-elect", "on", "--kube-lease-namespace", NS)
    cd1 = await kube_clusterd(tmp_path / "a", api.url, *elect)
    cd2 = sim = task = None
    try:
        await eventually(lambda: cd1.gate.following() is False, what="first replica leads")
        cd2 = await kube_clusterd(tmp_path / "b", api.url, *elect)
        assert cd2.gate.following()
        target = f"127.0.0.1:{cd2.grpc_port}"
        async with grpc.aio.insecure_channel(target) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pubfault_pb2_grpc.PubFaultStub(ch).SendPublicFault(public_request("f-1"))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "not the leader" in e.value.details()
        base = f"http://127.0.0.1:{cd2.http.port}"
        status, out = await http("POST", f"{base}/v1/jobs", [JOB])
        assert status == 503 and out["error"] == "follower"
        assert (await http("GET", f"{base}/v1/jobs"))[0] == 200  # reads answer
        status, why = await http("GET", f"{base}/readyz")
        assert status == 503 and "follower" in why
        rejected = cd2.registry.get_sample_value(
            "faultmesh_rejected_requests_total", {"service": "PubFault", "reason": "follower"}
        )
        assert rejected == 1
        # TaskD's client (trainsim, reconnecting) is refused by the follower and retries ...
        sim = TrainSim(target, "job-ha", reconnect=True)
        task = asyncio.create_task(sim.run())
        await eventually(lambda: any(ev["event"] == "reconnect-failed" for ev in sim.events), what="refused")
        assert not any(ev["event"] == "register" for ev in sim.events)
        # ... and registers once that replica leads (the leader stopped: the Lease is released).
        await cd1.stop()
        cd1 = None
        await eventually(lambda: not cd2.gate.following(), timeout_s=15, what="second replica leads")
        assert (await http("POST", f"{base}/v1/jobs", [JOB]))[0] == 200
        await eventually(
            lambda: any(ev["event"] == "register" and ev.get("code") == 0 for ev in sim.events),
            timeout_s=15,
            what="trainsim registered at the new leader",
        )
        # never a subscription without Init and Register first (a refused Init closes the channel)
        ok = next(i for i, ev in enumerate(sim.events) if ev["event"] == "register" and ev.get("code") == 0)
        assert "subscribed" not in [ev["event"] for ev in sim.events[:ok]]
    finally:
        if sim is not None:
            sim.stop()
            await asyncio.wait_for(task, 10)
        for cd in (cd1, cd2):
            if cd is not None:
                await cd.stop()
