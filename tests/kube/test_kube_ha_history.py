"""The history mirror (issue 30, failover keeps the record), in process against the Kubernetes emulator:
what one leader's store took comes back in the next leader's store; a slow or failing API server
never delays the fault path; a corrupt document never blocks an election; the window is bounded.
(The failover of real replica processes is tests/kube/test_kube_ha.py.)"""

from __future__ import annotations

import asyncio
import base64
import os

import kmock
import pytest
from prometheus_client import CollectorRegistry
from support import eventually

from clusterd.kube import hahistory
from clusterd.kube.cmdoc import pack
from clusterd.kube.hahistory import HistoryMetrics, HistoryMirror, HistoryStore
from clusterd.kube.hastate import KubeState, StateMetrics
from faultmesh.kube import KubeApi
from faultmesh.model import Fault, now_ms

NS = "faultmesh"
STATE_CM = "faultmesh-clusterd-state"
HIST_CM = "faultmesh-clusterd-state-history"


def fault(node: str, code: str = "80E18008", dev: int = 3, **attrs: str) -> Fault:
    return Fault("deviced", node, "NPU", dev, code, "RestartNPU", attributes=dict(attrs))


def make_store(api, path, leading=lambda: True, **kw) -> tuple[HistoryStore, HistoryMetrics]:
    api = KubeApi(api.api_client, timeout_s=1)
    state = KubeState(api, NS, STATE_CM, "me", leading, StateMetrics(CollectorRegistry()), write_s=5.0)
    hm = HistoryMetrics(CollectorRegistry())
    kw.setdefault("max_bytes", 900_000)
    kw.setdefault("write_s", 5.0)
    kw.setdefault("interval_s", 0.05)
    history = HistoryMirror(api, NS, HIST_CM, "me", leading, hm, **kw)
    return HistoryStore(state, history, path), hm


def count(metric, **labels) -> float:
    return metric.labels(**labels)._value.get() if labels else metric._value.get()


async def mirrored(store: HistoryStore, timeout_s: float = 15.0) -> None:
    """Until what ``store`` took is in the history ConfigMap (offered, applied, written)."""
    await store.history.worker.drain(timeout_s)
    await eventually(
        lambda: count(store.history.hm.unwritten) == 0, timeout_s=timeout_s, what="mirror written"
    )


async def put_doc(api, fields: dict) -> None:
    meta = {"name": HIST_CM, "namespace": NS}
    await api.create_config_map(NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **fields})


async def test_the_next_leader_holds_the_history_and_decisions_the_last_one_stored(k8s, tmp_path):
    emu, api = k8s
    a, hm = make_store(api, tmp_path / "a")
    await a.open()
    try:
        t = now_ms()
        await a.append_events(
            [(t - 5000, "occur", fault("node-1")), (t - 4000, "occur", fault("node-2", dev=0))]
        )
        await a.append_events([(t - 3000, "recover", fault("node-1"))])
        await a.append_events([(t - 2000, "release", Fault("operator", "node-2", "Node", -1, "IsolationBreaker",
                                                            "", attributes={"released_by": "alice"}))])  # fmt: skip
        recs = [{"time_ms": t - 4500, "flow": "process-recover", "decision": "stop-train", "reason": "r1",
                 "state": "s"}, {"time_ms": t - 3500, "flow": "process-recover", "decision": "dump",
                 "reason": "r2", "state": "s"}]  # fmt: skip
        await a.kv_put("decisions", "job-1", recs[:1])
        await a.kv_put("decisions", "job-1", recs)
        await a.kv_put("decisions", "job-2", [{"time_ms": t - 100, "decision": "fault-clear"}])
        await a.kv_put("jobs", "job-1", {"id": "job-1"})  # state: the state ConfigMap, not history
        await mirrored(a)
        before = await a.query_events()
        assert [r["kind"] for r in before] == ["occur", "occur", "recover", "release"]
    finally:
        await a.close()
    b, _ = make_store(api, tmp_path / "b")
    await b.open()
    try:
        assert await b.query_events() == before
        decisions = await b.kv_items("decisions")
        assert decisions == {"job-1": recs, "job-2": [{"time_ms": t - 100, "decision": "fault-clear"}]}
        # b carries a's window on: its own next write keeps a's rows (a second failover loses nothing)
        await b.append_events([(now_ms(), "occur", fault("node-3"))])
        await mirrored(b)
    finally:
        await b.close()
    c, _ = make_store(api, tmp_path / "c")
    await c.open()
    try:
        assert [r["node"] for r in await c.query_events()] == [
            "node-1",
            "node-2",
            "node-1",
            "node-2",
            "node-3",
        ]
        assert (await c.kv_items("decisions"))["job-1"] == recs
    finally:
        await c.close()


async def test_a_stalled_or_failing_api_server_never_delays_the_store(k8s, tmp_path):
    emu, api = k8s
    await put_doc(api, hahistory.encode({"version": 1, "events": [], "decisions": []}))
    store, hm = make_store(api, tmp_path / "s")
    await store.open()

    async def stalled():
        await asyncio.sleep(3)  # past the client's 1 s timeout: the write gets no answer
        return {}

    try:
        updates = emu[kmock.action.UPDATE, kmock.resource("v1/configmaps"), kmock.name(HIST_CM)]
        updates[0:2] << stalled
        updates[2:4] << 503
        await store.append_events([(now_ms(), "occur", fault("node-0"))])
        await eventually(lambda: len(updates) >= 1, what="the mirror write started")
        for i in range(1, 50):  # while that write hangs, each returns once SQLite has the row
            await store.append_events([(now_ms(), "occur", fault(f"node-{i}"))])
            await store.kv_put("decisions", f"job-{i}", [{"time_ms": now_ms(), "decision": "dump"}])
        assert len(await store.query_events()) == 50
        assert await store.history.worker.drain(5)
        assert count(hm.unwritten) == 50 + 49  # the tail a failover now would lose
        await mirrored(store, 30)
        assert count(hm.retries, reason="timeout") >= 1 and count(hm.retries, reason="server") >= 1
    finally:
        await store.close()
    again, _ = make_store(api, tmp_path / "again")
    await again.open()
    try:
        assert len(await again.query_events()) == 50 and len(await again.kv_items("decisions")) == 49
    finally:
        await again.close()


GOOD = hahistory.encode({"version": 1, "events": [], "decisions": []})
BLOB = GOOD["binaryData"]["history.json.gz"]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"data": {"sha256": "0" * 64}}, "missing key"),
        ({"data": GOOD["data"], "binaryData": {"history.json.gz": base64.b64encode(base64.b64decode(BLOB)[:-9]).decode()}}, "bad encoding"),
        ({"data": {"sha256": "0" * 64}, "binaryData": GOOD["binaryData"]}, "checksum mismatch"),
        (pack(b'{"version": 1, "events": [tru', "history.json.gz"), "bad JSON"),
        (hahistory.encode({"version": 9}), "unknown version"),
        (hahistory.encode({"version": 1, "events": {}, "decisions": []}), "bad shape"),
    ],
    ids=["missing-key", "truncated", "checksum", "bad-json", "version", "shape"],
)  # fmt: skip
async def test_a_corrupt_history_document_is_rejected_and_the_leader_starts(k8s, tmp_path, fields, reason):
    emu, api = k8s
    await put_doc(api, fields)
    store, hm = make_store(api, tmp_path / "s")
    await store.open()  # no crash, no wait: the history it has (none)
    try:
        assert count(hm.rejected, reason=reason) == 1
        assert await store.query_events() == [] and await store.kv_items("decisions") == {}
        kept = await api.get_config_map(NS, f"{HIST_CM}-rejected")
        assert reason in kept["data"]["rejected-reason"]
        await store.append_events([(now_ms(), "occur", fault("node-1"))])  # and writes a good one
        await mirrored(store)
        assert len(hahistory.decode(await api.get_config_map(NS, HIST_CM))["events"]) == 1
    finally:
        await store.close()


async def test_bad_rows_are_skipped_and_the_rest_imported(k8s, tmp_path):
    emu, api = k8s
    t = now_ms()
    good = hahistory.event_row(t, "occur", fault("node-1"))
    doc = {"version": 1, "events": [good, ["short"], [t, "occur", "n", "NPU", "x", "c", "s", "l", "a", {}]],
           "decisions": [["job-1", {"time_ms": t, "decision": "dump"}], ["job-1", {"decision": "no time"}], 7]}  # fmt: skip
    await put_doc(api, hahistory.encode(doc))
    store, hm = make_store(api, tmp_path / "s")
    await store.open()
    try:
        assert count(hm.rejected, reason="bad record") == 4
        assert [(r["node"], r["code"]) for r in await store.query_events()] == [("node-1", "80E18008")]
        assert await store.kv_items("decisions") == {"job-1": [{"time_ms": t, "decision": "dump"}]}
    finally:
        await store.close()


async def test_the_window_is_bounded_by_rows_age_and_bytes(k8s):
    emu, api = k8s
    hm = HistoryMetrics(CollectorRegistry())
    m = HistoryMirror(KubeApi(api.api_client), NS, HIST_CM, "me", lambda: True, hm, max_bytes=900_000,
                      write_s=1.0, max_events=100, max_decisions=10, window_s=3600)  # fmt: skip
    t = now_ms()
    m._apply([("e", [hahistory.event_row(t - 7200_000, "occur", fault("old"))])])  # older than the window
    m._apply([("e", [hahistory.event_row(t - i, "occur", fault(f"n{i}")) for i in range(150, 0, -1)])])
    m._apply([("d", "job", [{"time_ms": t - 7200_000}] + [{"time_ms": t - i} for i in range(30, 0, -1)])])
    doc = m.doc()
    assert [e[2] for e in doc["events"]] == [f"n{i}" for i in range(100, 0, -1)]  # the newest 100
    assert [d[1]["time_ms"] for d in doc["decisions"]] == [t - i for i in range(10, 0, -1)]
    # a document over the byte bound loses its oldest rows until it fits (counted), never the write
    rows = [hahistory.event_row(t, "occur", fault(f"b{i}", blob=os.urandom(2000).hex())) for i in range(100)]
    m._apply([("e", rows)])  # incompressible: about 270 kB encoded
    m.max_bytes = 60_000
    fields = await m._encode_fitting(m.doc())
    assert len(fields["binaryData"]["history.json.gz"]) <= 60_000
    kept = hahistory.decode(fields)["events"]
    assert kept and kept[-1][2] == "b99" and count(hm.trimmed, kind="events") == 100 - len(kept)
