"""The web view in a real headless Chromium (issue 17): every page loads with no console error, a
fault injected while the grid is open appears on it (server-sent events), the node page explains
the fault and shows its history, the job page plots per-rank step time, the pingmesh page draws the
link matrix. Screenshots go to the test's tmp dir and to /tmp/faultmesh-screens/ for a person."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aiohttp
import orjson
import pytest
from cdp import Browser, chromium
from support import make_clusterd

from faultmesh._pb import agent_pb2
from faultmesh.model import Fault
from fdol.slownet import topology as topo
from fdol.slownet.localize import FT_LOSS, OBJ_NPU, Alarm

needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="chromium not installed (apt-get install chromium; .ci/run installs it)"
)
SCREENS = Path("/tmp/faultmesh-screens")
NODES = ["node-1", "node-2", "node-3", "node-4"]
PLACEMENT = {str(r): NODES[r // 4] for r in range(8)}  # ranks 0-3 on node-1, 4-7 on node-2


async def _shot(page, tmp_path: Path, name: str) -> Path:
    p = await page.screenshot(tmp_path / f"{name}.png")

    def keep() -> int:
        SCREENS.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, SCREENS / p.name)
        return p.stat().st_size

    assert await asyncio.to_thread(keep) > 5000, f"{name}: screenshot looks empty"
    return p


async def _post(cd, path, body):
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{cd.http.port}{path}", data=json.dumps(body)) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def _seed(cd):
    """Four nodes with 8 NPUs each, a job with slow-node data and decisions, a super pod matrix."""
    for i, n in enumerate(NODES):
        cd.nodes.hello(n, f"10.0.0.{i + 1}", f"SN-{i}", "boot")
        cd.nodes.update(
            n, devices=[{"device_type": "NPU", "device_id": d, "health": "Healthy"} for d in range(8)]
        )
    await cd.center.upsert(Fault("deviced", "node-3", "NPU", 5, "80E18402", "SubHealthFault"))
    # a SubHealth slow-node fault on node-2 itself: its node-level cell stays the SubHealthy colour
    # when an NPU fault makes node-2 UnHealthy (issue 31: it was drawn red)
    await cd.center.upsert(Fault("fd-online", "node-2", "Node", -1, "110001010", "SubHealthFault"))
    await _slow_job(cd, "job-web", "bert", pattern=True)
    cd.brain.decision_log.record("job-web", "recover", "stop-train", "fault on rank 5", "Stopping")
    cd.brain.decision_log.record("job-web", "recover", "recover-success", "rank 5 restarted", "INIT")
    await _slow_job(cd, "job-np", "gpt", pattern=False)
    sp = topo.build_super_pod(0, NODES, npus_per_node=8)
    src, dst = topo.make_sdid(2, 3), topo.make_sdid(4, 1)  # node-2 NPU 3, node-4 NPU 1 (servers 1..4)
    await _post(cd, "/v1/pingmesh/topology", sp.to_json_obj())
    pod = next(c for c in cd.components if c.name == "slownet").pods["0"]
    loss = {("node-2", "node-4"): 0.6, ("node-4", "node-2"): 0.35}
    pod.status["latest"] = {
        "matrix": [
            {
                "srcNode": s,
                "dstNode": d,
                "paths": 8,
                "faultyPaths": int(loss.get((s, d), 0) > 0),
                "avgLossRate": loss.get((s, d), 0.0),
                "avgDelay": 0.2,
            }
            for s in NODES
            for d in NODES
        ]  # fmt: skip
    }
    link = Alarm("link", "0", str(src), OBJ_NPU, str(dst), OBJ_NPU, FT_LOSS, 2, "node-2", phy=3,
                 peer_node="node-4", peer_phy=1, avg_loss=0.6)  # fmt: skip
    pod.status["alarms"] = [
        {**link.to_dict(), "firstSeenMs": 1_700_000_000_000, "lastSeenMs": 1_700_000_060_000}
    ]


async def _slow_job(cd, job_id: str, name: str, pattern: bool) -> None:
    """A job on node-1 and node-2 with slow-node detection and one round of node results (rank 6
    slow on node-2); with ``pattern`` the results carry per-rank compute / wait ratios."""
    ranks = [{"rank": r, "node": n, "device": r % 4} for r, n in ((int(k), v) for k, v in PLACEMENT.items())]
    await _post(cd, "/v1/jobs", [{"id": job_id, "name": name, "namespace": "default", "ranks": ranks}])
    conf = {"jobName": name, "jobNamespace": "default", "jobId": job_id, "normalNumber": 20, "nSigma": 3,
            "degradationPercentage": 0.3, "nConsecAnomaliesSignifySlow": 3, "nSecondsDoOneDetection": 3600,
            "clusterMeanDistance": 1.3, "cardOneNode": 16, "SlowNode": 1, "patternWindowSteps": 20}  # fmt: skip
    st = await _post(cd, "/v1/slownode/jobs", {**conf, "ranks": PLACEMENT})
    sn = next(c for c in cd.components if c.name == "slownode")
    js = sn.jobs[st["jobId"]]
    for node in ("node-1", "node-2"):
        mine = [r for r, n in PLACEMENT.items() if n == node]
        res = {"isSlow": int(node == "node-2"), "degradationLevel": "45.0%", "jobId": js.conf.job_id,
               "nodeRank": node, "slowCalculateRanks": [6] if node == "node-2" else [],
               "slowCommunicationDomains": [], "slowSendRanks": [], "slowHostNodes": [], "slowIORanks": [],
               "suspectRanks": [], "lastStep": 120, "baselineReady": True}  # fmt: skip
        if pattern:
            res["pattern"] = {
                r: [1.0 + (0.45 if r == "6" else 0.02 * int(r) % 3), 0.3 if r != "6" else 0.05] for r in mine
            }
        body = orjson.dumps({f"slownode_{js.conf.job_id}": {node: res}})
        sn._on_report(node, agent_pb2.SlowNodeReport(job_id=js.conf.job_id, result_json=body))
    await sn.run_round(js)


def _bg(selector: str) -> str:
    """JS: the computed background colour of ``selector`` (what a person sees, not a class name)."""
    return f"getComputedStyle(document.querySelector({json.dumps(selector)})).backgroundColor"


SUB, BAD = "rgb(232, 176, 35)", "rgb(217, 65, 46)"  # style.css --sub, --unhealthy


@needs_chromium
async def test_pages_in_chromium(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        await _seed(cd)
        base = f"http://127.0.0.1:{cd.http.port}"
        async with Browser.launch(tmp_path / "profile") as b:
            page = await b.page()
            await page.goto(base + "/")
            assert await page.evaluate("document.querySelectorAll('#grid tr[data-node]').length") == 4
            assert (
                await page.evaluate(
                    "document.querySelector('[data-node=node-3] [data-npu=\"5\"]').dataset.level"
                )
                == "SubHealthFault"
            )
            await page.wait_for("document.getElementById('live').className === 'live on'")
            # a fault injected now appears on the open grid, live
            await cd.center.upsert(Fault("deviced", "node-2", "NPU", 3, "80E18008", "RestartNPU"))
            await page.wait_for(
                "(document.querySelector('[data-node=node-2] [data-npu=\"3\"]') || {dataset: {}}).dataset.level === 'RestartNPU'"
            )
            assert (
                await page.evaluate("document.querySelector('[data-node=node-2]').dataset.health")
                == "UnHealthy"
            )
            assert await page.evaluate(_bg('[data-node=node-2] [data-npu="3"]')) == BAD
            assert await page.evaluate(_bg("[data-node=node-2] [data-cell=node]")) == SUB  # its own level
            assert await page.evaluate(_bg('[data-node=node-3] [data-npu="5"]')) == SUB
            await _shot(page, tmp_path, "grid-with-fault")
            ack = {"node": "node-2", "code": "80E18008", "for_s": 3600, "by": "ops", "reason": "swap booked"}
            await _post(cd, "/v1/acks", ack)
            # a cell's faults on hover (title) and on keyboard focus (its label drawn below it)
            await page.goto(base + "/?again")
            await page.wait_for("location.search === '?again' && !!document.getElementById('grid')")
            cell = '[data-node=node-2] [data-npu="3"]'
            title = await page.evaluate(f"document.querySelector({json.dumps(cell)}).title")
            assert title.startswith("80E18008 ") and ": RestartNPU (" in title, title
            assert "acknowledged by ops" in title, title
            outline = f"getComputedStyle(document.querySelector({json.dumps(cell)})).outlineStyle"
            assert await page.evaluate(outline) == "dashed"  # every fault of the cell acknowledged
            assert await page.evaluate(outline.replace('"3"', '"5"').replace("node-2", "node-3")) != "dashed"
            assert "110001010" in await page.evaluate(
                "document.querySelector('[data-node=node-2] [data-cell=node]').title"
            )
            await page.send("Emulation.setFocusEmulationEnabled", enabled=True)  # headless: no window focus
            await page.evaluate(f"document.querySelector({json.dumps(cell)}).focus()")
            shown = await page.evaluate(
                f"getComputedStyle(document.querySelector({json.dumps(cell)}), '::after').content"
            )
            assert "80E18008" in shown and "RestartNPU" in shown, shown
            await _shot(page, tmp_path, "grid-cell-focused")
            # a GPU's XID (deviced --backend nvml reports GPUs as device type NPU): shown as a GPU
            gpu = Fault("dcmi", "node-2", "NPU", 6, "4E560000004F", "SeparateNPU")
            await cd.center.upsert(gpu, origin="deviced")
            await page.goto(base + "/ui/node/node-2")
            await page.wait_for(
                "location.pathname === '/ui/node/node-2' && !!document.getElementById('node-jobs')"
            )
            text = await page.evaluate("document.getElementById('faults').innerText")
            assert "80E18008" in text and "RestartNPU" in text and "no description shipped" not in text
            [gpu_row] = [ln for ln in text.splitlines() if "4E560000004F" in ln]
            assert gpu_row.startswith("GPU-6\t") and "Xid 79: GPU has fallen off the bus" in gpu_row, gpu_row
            row = await page.evaluate(
                "[...document.querySelectorAll('#faults tr.acked')].map(r => r.innerText)"
            )
            assert (
                len(row) == 1 and "80E18008" in row[0] and "ops until" in row[0] and "swap booked" in row[0]
            ), row
            history = await page.evaluate("document.getElementById('history').innerText")
            assert "occur" in history and "acknowledged by ops (no token) until" in history
            # a plain agent row says who reported it (the server's words, as `faultmesh history`)
            assert "\toccur\tNode\t110001010\tSubHealthFault\tfd-online\treported by fd-online" in history
            # the jobs its faults touch: ranks 4-7 on node-2 (device = rank % 4), every one reached by
            # the node-level 110001010, rank 7 (NPU 3) by 80E18008 too; each job linked to its page
            jobs = await page.evaluate("document.getElementById('node-jobs').innerText")
            assert "bert" in jobs and "gpt" in jobs, jobs
            assert "rank 7 (NPU 3): 110001010, 80E18008" in jobs and "rank 4 (NPU 0): 110001010" in jobs, jobs
            links = await page.evaluate("[...document.querySelectorAll('#node-jobs a')].map(a => a.pathname)")
            assert sorted(links) == ["/ui/job/job-np", "/ui/job/job-web"]
            # rendered from one fetch
            fetched = await page.evaluate(
                "[...new Set(performance.getEntriesByType('resource').filter(e => e.initiatorType === 'fetch')"
                ".map(e => new URL(e.name).pathname))]"
            )
            assert fetched == ["/v1/nodes/node-2/view"], fetched
            await _shot(page, tmp_path, "node")
            # the jobs list, reached from the cluster page
            await page.goto(base + "/")
            await page.evaluate("document.getElementById('jobs-link').click()")
            await page.wait_for("document.body.dataset.ready === '1' && !!document.getElementById('jobs')")
            jobs = await page.evaluate("document.getElementById('jobs').innerText")
            assert "bert" in jobs and "gpt" in jobs and "INIT" not in jobs, jobs
            await page.evaluate(
                "[...document.querySelectorAll('#jobs a')].find(a => a.innerText === 'bert').click()"
            )
            await page.wait_for(
                "location.pathname === '/ui/job/job-web' && document.body.dataset.ready === '1'"
            )

            assert await page.evaluate("document.querySelectorAll('#slowplot svg rect').length") >= 16
            rec = await page.evaluate("document.getElementById('recovery').innerText")
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/v1/jobs/job-web/recovery") as r:
                    api = await r.json()
            last = api["decisions"][-1]  # the brain's latest (the RestartNPU fault above adds one)
            assert not api["registered"] and "recover-success" in [d["decision"] for d in api["decisions"]]
            assert rec.startswith(
                f"recovery: no Recover client registered, last decision: {last['flow']} {last['decision']}"
            )
            assert "INIT" not in rec, rec
            results = await page.evaluate("document.getElementById('noderesults').innerText")
            assert "node-2\tyes\t45.0%\t120\tready\t6" in results, results
            assert "stop-train" in await page.evaluate("document.getElementById('decisions').innerText")
            assert await page.evaluate("document.querySelectorAll('#ranks td.cell').length") == 8
            # rank 7 sits on node-2 NPU 3, which has the RestartNPU fault: red, its code on hover
            rank7 = '#ranks [data-node=node-2][data-npu="3"]'
            assert await page.evaluate(f"document.querySelector({json.dumps(rank7)}).innerText") == "7"
            assert await page.evaluate(_bg(rank7)) == BAD
            title = await page.evaluate(f"document.querySelector({json.dumps(rank7)}).title")
            assert title.startswith("80E18008 ") and "RestartNPU" in title, title
            assert await page.evaluate(_bg('#ranks [data-node=node-1][data-npu="0"]')) != BAD
            # the confirmed state and the latest round said apart (issue 31: "degraded" beside 0.0%)
            summary = await page.evaluate("document.getElementById('slowsummary').innerText")
            assert "degradation confirmed: no" in summary and "latest round: slow ranks [6]" in summary, (
                summary
            )
            assert "degradation 45.00%" in summary, summary
            # rendered from one fetch, marked ready
            fetched = await page.evaluate(
                "[...new Set(performance.getEntriesByType('resource').filter(e => e.initiatorType === 'fetch')"
                ".map(e => new URL(e.name).pathname))]"
            )
            assert fetched == ["/v1/jobs/job-web/view"], fetched
            await _shot(page, tmp_path, "job")
            await page.goto(base + "/ui/job/job-np")  # rounds done, no per-rank ratios: say why
            await page.wait_for(
                "location.pathname === '/ui/job/job-np' && document.body.dataset.ready === '1'"
            )
            why = await page.evaluate("document.getElementById('slowplot-none').innerText")
            assert "pattern detector" in why and '"faultmesh"' in why, why
            assert "node-2" in await page.evaluate("document.getElementById('noderesults').innerText")

            await page.goto(base + "/ui/pingmesh")
            cells = await page.evaluate(
                "[...document.querySelectorAll('.heat rect[data-src]')].map(r => [r.dataset.src, r.dataset.dst, r.dataset.value])"
            )
            assert len(cells) == 16 and ["node-2", "node-4", "0.6"] in cells
            alarms = await page.evaluate("document.querySelector('table.alarms').innerText")
            assert "node-2 NPU 3 \u2192 node-4 NPU 1" in alarms and "link loss" in alarms, alarms
            await _shot(page, tmp_path, "pingmesh")
            assert page.errors == []
            await asyncio.sleep(0)  # the open event stream ends with clusterd's stop below
    finally:
        await cd.stop()


async def test_job_view_is_the_job_page_in_one_answer(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        await _seed(cd)
        await cd.center.upsert(Fault("deviced", "node-2", "NPU", 3, "80E18008", "RestartNPU"))
        base = f"http://127.0.0.1:{cd.http.port}"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/v1/jobs/job-web/view") as r:
                assert r.status == 200
                v = await r.json()
            async with s.get(f"{base}/v1/jobs/job-web/recovery") as r:
                assert v["recovery"] == await r.json()
            async with s.get(f"{base}/v1/jobs/nope/view") as r:
                assert r.status == 404 and "nope" in (await r.json())["error"]
        assert (
            v["job"]["id"] == "job-web" and len(v["job"]["ranks"]) == 8 and v["job"]["health"] == "UnHealthy"
        )
        assert [d["decision"] for d in v["recovery"]["decisions"]][:2] == ["stop-train", "recover-success"]
        assert sorted(v["cells"]) == ["node-1", "node-2"]  # only the job's nodes
        assert v["cells"]["node-2"]["3"]["level"] == "RestartNPU" and v["cells"]["node-1"]["3"]["faults"] == 0
        assert v["slownode"]["jobId"] == "job-web" and v["slownode"]["rounds"] == 1
        assert v["slownode"]["nodeResults"]["node-2"]["slowCalculateRanks"] == [6]
        await _post(cd, "/v1/jobs", [{"id": "job-off", "name": "t5", "namespace": "default", "ranks": []}])
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/v1/jobs/job-off/view") as r:
                off = await r.json()
        assert off["slownode"] is None and off["cells"] == {} and off["recovery"]["decisions"] == []
    finally:
        await cd.stop()


async def test_static_files_and_faultinfo(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        base = f"http://127.0.0.1:{cd.http.port}"
        async with aiohttp.ClientSession() as s:
            for path, ctype in (
                ("/", "text/html"),
                ("/ui/static/app.js", "text/javascript"),
                ("/ui/static/style.css", "text/css"),
            ):
                async with s.get(base + path) as r:
                    assert r.status == 200 and r.content_type == ctype
            for bad in ("/ui/static/..%2Fapp.py", "/ui/static/nope.js", "/ui/static/__init__.py"):
                async with s.get(base + bad) as r:
                    assert r.status == 404
            async with s.get(base + "/v1/faultinfo/80E18008") as r:
                body = await r.json()
                assert body["known"] and body["meaning"]["name"]
            async with s.get(base + "/v1/faultinfo/zz") as r:
                assert r.status == 400
    finally:
        await cd.stop()
