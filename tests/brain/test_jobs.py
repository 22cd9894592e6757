"""The job registry: spec validation, HTTP and CLI apply, fault -> rank mapping, JobInfo to deviced."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from brain.brainkit import apply, job_spec, npu_fault

from clusterd.brain.faultview import job_health, job_rank_faults
from clusterd.brain.jobs import JobSpecError, parse_job, parse_jobs_text
from faultmesh.agent import AgentClient
from faultmesh.jobspec import job_from_store
from faultmesh.model import Fault


def test_spec_defaults_and_strategy_order():
    job = parse_job(job_spec(**{"recover-strategy": "dump, retry,recover-in-place"}))
    assert job.strategies() == ["retry", "recover-in-place", "dump", "exit"]
    assert job.rescheduling() == ["job-rescheduling"]
    assert job.nodes() == ["node-a", "node-b"]
    assert job.pod_rank("node-b") == 1 and job.pod_rank("node-x") == -1
    assert job.rank_table()["server_list"][1]["device"] == [
        {"device_id": "0", "rank_id": "2"},
        {"device_id": "1", "rank_id": "3"},
    ]


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"id": ""}, "id"),
        ({"name": "Bad_Name"}, "name"),
        ({"recover-strategy": "retry,teleport"}, "teleport"),
        ({"subHealthyStrategy": "panic"}, "subHealthyStrategy"),
        ({"status": "sleeping"}, "status"),
        ({"ranks": [{"rank": 0, "node": "a", "device": 0}, {"rank": 0, "node": "b", "device": 0}]}, "twice"),
        (
            {"ranks": [{"rank": 0, "node": "a", "device": 0}, {"rank": 1, "node": "a", "device": 0}]},
            "two ranks",
        ),
        ({"ranks": [{"rank": "x", "node": "a", "device": 0}]}, "integers"),
        ({"ranks": [{"rank": True, "node": "a", "device": False}]}, "integers"),  # not rank 1, device 0
        ({"ranks": [{"rank": 1.5, "node": "a", "device": 0}]}, "integers"),
        ({"mindioWaitMindxTime": True}, "mindioWaitMindxTime must be an integer"),
        ({"ranks": "all"}, "list"),
        ({"ranks": [{"rank": 0, "node": "a", "device": 0, "deviceIp": "300.1.1.1"}]}, "deviceIp"),
        ({"pods": [{"node": "a", "podIp": "not-an-ip"}]}, r"pods\[0\]: podIp"),
        ({"pods": [{"podIp": "10.0.0.1"}]}, "node and podIp"),
        ({"pods": "a"}, "pods must be a list"),
        ({"jobID": "x" * 129}, "jobID"),
    ],
)
def test_bad_specs_name_the_field(over, needle):
    with pytest.raises(JobSpecError, match=needle):
        parse_job(job_spec(**over))


def test_mindie_fields_round_trip():
    spec = job_spec(jobID="svc-1", app="mindie-ms-server", deployServer="2")
    spec["pods"] = [{"node": "node-a", "podIp": "172.16.0.1", "hostIp": "10.0.0.1"}]
    spec["ranks"][0]["deviceIp"] = "192.168.0.1"
    job = parse_job(spec)
    assert (job.mindie_job_id, job.app, job.deploy_server) == ("svc-1", "mindie-ms-server", "2")
    assert (job.pods[0].pod_ip, job.pods[0].host_ip, job.ranks[0].device_ip) == (
        "172.16.0.1",
        "10.0.0.1",
        "192.168.0.1",
    )
    assert parse_job(job.to_dict()) == job
    assert "jobID" not in parse_job(job_spec()).to_dict()  # a training job's JSON is unchanged


def test_podgroup_extra_counts_in_job_equality():
    """A job whose PodGroup-only settings (``extra``: wait-reschedule-timeout, ...) changed is a
    changed job, so the registry applies it; ``extra`` is no part of the hash (a dict)."""
    job = parse_job(job_spec())
    a = dataclasses.replace(job, extra={"wait-reschedule-timeout": "60"})
    b = dataclasses.replace(job, extra={"wait-reschedule-timeout": "90"})
    assert a != b and a == dataclasses.replace(job, extra={"wait-reschedule-timeout": "60"})
    assert hash(a) == hash(b)
    # kept in the store, so a restart's first Kubernetes sync finds the job unchanged
    assert job_from_store(a.to_dict()) == a and job_from_store(job.to_dict()).extra == {}


def test_yaml_documents_and_lists():
    text = "id: j1\nname: a\nranks: []\n---\n- {id: j2, name: b}\n- {id: j3, name: c, process-recover-enable: on}\n"
    jobs = parse_jobs_text(text)
    assert [j.id for j in jobs] == ["j1", "j2", "j3"]
    assert jobs[2].process_recover_enable == "on"  # YAML 1.1 "on" -> True -> "on"
    with pytest.raises(JobSpecError, match="job 1: id j1 appears twice"):
        parse_jobs_text('[{"id": "j1", "name": "a"}, {"id": "j1", "name": "b"}]')
    with pytest.raises(JobSpecError, match="not JSON or YAML"):
        parse_jobs_text("{: [")
    with pytest.raises(JobSpecError, match="no job in the document"):
        parse_jobs_text("null")


def test_a_large_job_file_and_out_of_range_ids():
    """A 20k-rank JSON job (the tryout froze clusterd for 4 min with one: YAML parsing and
    per-node views over every rank) parses, and its placement views agree with its ranks; ids
    beyond int32 (as RankPlacement carries them) are a clear error, not a 500 from the store."""
    n = 20_000
    spec = {
        "id": "big",
        "name": "big",
        "ranks": [{"rank": r, "node": f"s{r // 16}", "device": r % 16} for r in range(n)],
    }
    (job,) = parse_jobs_text(json.dumps(spec))
    assert len(job.ranks) == n and len(job.nodes()) == n // 16
    assert job.nodes()[:3] == ["s0", "s1", "s2"] and job.pod_rank("s1249") == 1249 and job.pod_rank("x") == -1
    assert [r.rank for r in job.ranks_on("s3")] == list(range(48, 64))
    assert job.rank_of("s3", 5).rank == 53 and job.rank_of("s3", 16) is None
    assert job.node_of_rank(19_999) == "s1249" and job.node_of_rank(n) is None
    for field, value in (("device", 10**30), ("rank", 2**31), ("superPodId", -2)):
        bad = {"id": "b", "name": "b", "ranks": [{"rank": 0, "node": "s0", "device": 0, field: value}]}
        with pytest.raises(JobSpecError, match="must be in 0..2147483647"):
            parse_jobs_text(json.dumps(bad))


def test_fault_mapping_npu_node_and_hidden():
    job = parse_job(job_spec())
    faults = {
        "node-a": [
            Fault("deviced", "node-a", "NPU", 1, "80E18402", "RestartNPU"),
            Fault("deviced", "node-a", "NPU", 7, "80E18402", "RestartNPU"),  # not a job device
        ],
        "node-b": [
            Fault("noded", "node-b", "CPU", 0, "00000001", "SeparateFault"),  # node-scope: every rank
            Fault("noded", "node-b", "Memory", 0, "00000002", "NotHandleFault"),  # healthy: ignored
            Fault("deviced", "node-b", "NPU", 0, "80818C05", "SubHealthFault"),
        ],
    }
    view = job_rank_faults(job, lambda n: faults.get(n, []))
    assert [(f.rank, f.code, f.level, f.pod_rank) for f in view] == [
        (1, "80E18402", "RestartNPU", 0),
        (2, "00000001", "SeparateNPU", 1),
        (2, "80818C05", "SubHealthFault", 1),
        (3, "00000001", "SeparateNPU", 1),
    ]
    assert job_health(view) == "UnHealthy"
    hidden = job_rank_faults(job, lambda n: faults.get(n, []), lambda n, f: f.code == "80818C05")
    assert all(f.code != "80818C05" for f in hidden)
    sub = job_rank_faults(job, lambda n: [faults["node-b"][2]] if n == "node-b" else [])
    assert job_health(sub) == "SubHealthy"


def _http(cd, method, path, body=None, raw=None):
    url = f"http://{cd.http.host}:{cd.http.port}{path}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_http_apply_get_list_delete_and_persistence(cd, tmp_path):
    st, out = await asyncio.to_thread(_http, cd, "POST", "/v1/jobs", [job_spec()])
    assert st == 200 and out == [
        {"id": "job-0001-uid", "name": "llama", "namespace": "default", "result": "created"}
    ]
    st, out = await asyncio.to_thread(_http, cd, "POST", "/v1/jobs", {"jobs": [job_spec()]})
    assert out[0]["result"] == "unchanged"
    st, out = await asyncio.to_thread(_http, cd, "POST", "/v1/jobs", None, b"id: j9\nname: other\n")
    assert st == 200 and out[0]["result"] == "created"
    st, out = await asyncio.to_thread(_http, cd, "POST", "/v1/jobs", [job_spec(id="zzz-other")])
    assert st == 400 and "already exists" in out["error"]
    st, out = await asyncio.to_thread(_http, cd, "POST", "/v1/jobs", [job_spec(ranks=[{"rank": -1}])])
    assert st == 400 and "ranks[0]" in out["error"]
    await cd.center.upsert(npu_fault())
    st, job = await asyncio.to_thread(_http, cd, "GET", "/v1/jobs/job-0001-uid")
    assert st == 200 and job["health"] == "UnHealthy"
    assert [(f["rank"], f["code"]) for f in job["faults"]] == [(2, "80E18402")]
    assert job["node_faults"][0]["nodeName"] == "node-b"
    st, jobs = await asyncio.to_thread(_http, cd, "GET", "/v1/jobs")
    assert [j["id"] for j in jobs] == ["job-0001-uid", "j9"]
    st, out = await asyncio.to_thread(_http, cd, "GET", "/v1/jobs/nope")
    assert st == 404
    st, out = await asyncio.to_thread(_http, cd, "DELETE", "/v1/jobs/j9")
    assert st == 200 and cd.jobs.get("j9") is None
    st, out = await asyncio.to_thread(_http, cd, "DELETE", "/v1/jobs/j9")
    assert st == 404
    # the registry is durable
    from clusterd.brain.jobs import JobRegistry

    reg = JobRegistry(cd.store)
    assert await reg.load() == 1 and reg.get("job-0001-uid").ranks == cd.jobs.get("job-0001-uid").ranks


async def test_a_held_degrade_survives_the_sync_but_not_a_users_apply(cd):
    """JobRegistry.update(hold=True) against apply(keep_held=True) (the Kubernetes pod sync): the held
    value stays while the source repeats what it replaced; a user's apply (no keep_held) ends it."""
    from clusterd.brain.jobs import JobRegistry

    reg = JobRegistry(cd.store)
    spec = parse_job(job_spec(job_id="jh", name="held", subHealthyStrategy="hotSwitch"))
    await reg.apply([spec])
    await reg.update("jh", hold=True, sub_healthy_strategy="ignore")
    (res,) = await reg.apply([spec], keep_held=True)
    assert res[1] == "unchanged" and reg.get("jh").sub_healthy_strategy == "ignore"
    await reg.apply([dataclasses.replace(spec, pod_rescheduling="on")], keep_held=True)
    assert (reg.get("jh").sub_healthy_strategy, reg.get("jh").pod_rescheduling) == ("ignore", "on")
    await reg.apply([spec])  # the user applies the job again: hotSwitch is meant
    assert reg.get("jh").sub_healthy_strategy == "hotSwitch"
    await reg.apply([spec], keep_held=True)
    assert reg.get("jh").sub_healthy_strategy == "hotSwitch"


async def test_jobinfo_goes_to_deviced_on_apply_and_reconnect(cd):
    got: list = []

    async def on_control(msg):
        if msg.WhichOneof("body") == "job":
            got.append(msg.job)

    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-b", "deviced", on_control=on_control)
    await client.start()
    try:
        await client.wait_synced()
        await apply(cd)
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.02)
        assert got[0].job_id == "job-0001-uid" and got[0].name == "llama" and not got[0].deleted
        assert [(r.rank, r.node, r.device_id) for r in got[0].ranks][2:] == [
            (2, "node-b", 0),
            (3, "node-b", 1),
        ]
        # moving the job off node-b sends deleted=True there
        spec = job_spec()
        spec["ranks"] = [r for r in spec["ranks"] if r["node"] == "node-a"]
        await cd.jobs.apply([parse_job(spec)])
        async with asyncio.timeout(5):
            while not got[-1].deleted:
                await asyncio.sleep(0.02)
    finally:
        await client.stop()
    # on reconnect, deviced gets the jobs of its node again
    await apply(cd)
    got.clear()
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-b", "deviced", on_control=on_control)
    await client.start()
    try:
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.02)
        assert got[-1].job_id == "job-0001-uid" and not got[-1].deleted
    finally:
        await client.stop()


def _cli(cd, *argv, stdin=None):
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from fmtools.cli import main; sys.exit(main())",
            *argv,
            "--http",
            f"{cd.http.host}:{cd.http.port}",
        ],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=30,
    )


async def test_cli_job_apply_jobs_and_errors(cd, tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(
        "id: job-cli-0001\nname: bert\nrecover-strategy: [recover]\nranks:\n  - {rank: 0, node: node-a, device: 0}\n"
    )
    r = await asyncio.to_thread(_cli, cd, "job", "apply", "-f", str(f))
    assert r.returncode == 0, r.stderr
    assert "bert" in r.stdout and "created" in r.stdout
    r = await asyncio.to_thread(_cli, cd, "jobs", "-o", "json")
    assert [j["name"] for j in json.loads(r.stdout)] == ["bert"]
    r = await asyncio.to_thread(_cli, cd, "jobs")
    assert r.stdout.splitlines()[0].split()[:3] == ["NAMESPACE", "NAME", "ID"] and "recover,exit" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x1", "name": "q", "recover-strategy": "warp"}')
    r = await asyncio.to_thread(_cli, cd, "job", "apply", "-f", str(bad))
    assert r.returncode == 2 and "unknown values ['warp']" in r.stderr
    r = await asyncio.to_thread(_cli, cd, "job", "apply", "-f", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = await asyncio.to_thread(_cli, cd, "job", "get", "job-cli-0001")
    assert r.returncode == 0 and "RANK" in r.stdout
    r = await asyncio.to_thread(_cli, cd, "job", "get", "nope")
    assert r.returncode == 4 and "HTTP 404" in r.stderr
    r = await asyncio.to_thread(_cli, cd, "job", "delete", "job-cli-0001")
    assert r.returncode == 0
