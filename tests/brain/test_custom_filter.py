"""A job's fault filter annotations (the reference's custom processor, clusterd.md §6.2 "custom"):
``huawei.com/schedule.filter.faultCode`` / ``.faultLevel`` keep young faults on the job's devices
out of its fault view until they have lasted longer than their window."""

from __future__ import annotations

import asyncio

import pytest
from brain.brainkit import JOB, MINDIE, apply, apply_specs, decisions, mindie_specs, npu_fault, wait_decision

from clusterd.brain.jobs import parse_job
from clusterd.kube.podgroups import read_settings
from faultmesh._pb import fault_pb2, fault_pb2_grpc
from faultmesh.faultfilter import CODE_KEY, LEVEL_KEY, parse_filter
from faultmesh.jobspec import JobSpecError
from faultmesh.model import Fault, now_ms


def test_annotation_syntax_as_the_reference_reads_it():
    assert parse_filter("8C1F8608:30, 80E01801", "code") == ({"8C1F8608": 30, "80E01801": 60}, [])
    # a switch code keeps its commas; full-width comma and colon; a bad window is 60 s
    codes, bad = parse_filter("[0x08520003,,l2,NA]:20，0x80e18008：5,80E01801:99999", "code")
    assert (codes, bad) == ({"[0x08520003,na,L2,na]": 20, "80E18008": 5, "80E01801": 60}, [])
    levels, bad = parse_filter("RestartRequestFault:30, ResetFault, PreSeparateFault:x, Bogus", "level")
    assert levels == {"RestartRequest": 30, "Separate": 60, "PreSeparate": 60}
    assert bad == ["fault level 'Bogus' is not an NPU or switch level"]


def test_job_apply_refuses_a_bad_entry_and_kube_mode_drops_it_with_a_reason():
    with pytest.raises(JobSpecError, match="filter.faultCode: fault code 'zz' is neither"):
        parse_job({"id": "job-1", "name": "a", CODE_KEY: "80E01801:5, zz"})
    pg = {"metadata": {"annotations": {CODE_KEY: "80E01801:5, zz", LEVEL_KEY: "RestartRequest"}}}
    settings, _extra, problems = read_settings(pg)
    assert (settings[CODE_KEY], settings[LEVEL_KEY]) == ("80E01801:5", "RestartRequest:60")
    assert problems == [f"{CODE_KEY}: fault code 'zz' is neither a chip nor a switch code"]
    job = parse_job({"id": "job-1", "name": "a", **settings})
    assert (job.filter_fault_code, job.filter_fault_level) == ("80E01801:5", "RestartRequest:60")


async def add_young(cd, f: Fault) -> None:
    """Store ``f`` first seen now and wait until the brain's subscription took it and the clock moved
    past its first-seen millisecond (a window of 0 s hides a fault during that millisecond, as the
    reference's ``durationMs > timeout``)."""
    now = now_ms()
    await cd.center.upsert(
        Fault(f.source, f.node, f.device_type, f.device_id, f.code, f.level, "occur", now, now)
    )
    assert await cd.center.drain_sinks(5.0), "the fault center's subscribers did not catch up"
    for _ in range(200):
        if any(x.code == f.code for x in cd.brain.faults_of_node(f.node)) and now_ms() > now:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the brain never saw {f.code}")


async def test_a_filtered_fault_starts_the_recovery_only_once_its_window_is_over(cd, sims):
    await apply(cd, **{LEVEL_KEY: "RestartNPU:1"})
    await sims.start()
    await add_young(cd, npu_fault())  # RestartNPU on rank 2
    await asyncio.sleep(0.6)
    assert decisions(cd) == [] and cd.brain.rank_faults(cd.jobs.get(JOB)) == []
    # the re-evaluation timer brings the fault back after its 1 s window: the flow starts then
    first = await wait_decision(cd, "pre-exit", timeout_s=5)
    assert [(f["rank"], f["code"]) for f in first["faults"]] == [(2, "80E18402")]


async def test_the_code_entry_wins_over_the_level_entry(cd):
    job = await apply(cd, **{CODE_KEY: "80E18402:0", LEVEL_KEY: "RestartNPU:60"})
    await add_young(cd, npu_fault())
    assert [f.code for f in cd.brain.rank_faults(job)] == ["80E18402"]  # window 0: shown at once
    await add_young(cd, npu_fault(dev=1, code="80E18008"))  # only the level entry: hidden
    assert [f.code for f in cd.brain.rank_faults(job)] == ["80E18402"]


async def test_mindie_server_hides_restart_request_while_its_controller_subscribes(cd, channel):
    jobs = {j.id: j for j in await apply_specs(cd, mindie_specs())}
    server = jobs[f"{MINDIE}-server-0"]
    await add_young(cd, npu_fault(node="node-s0-0", dev=1, code="80C98009", level="RestartRequest"))
    assert [f.rank for f in cd.brain.rank_faults(server)] == [1]  # nobody subscribed: not hidden
    stub = fault_pb2_grpc.FaultStub(channel)
    ci = fault_pb2.ClientInfo(jobId=MINDIE, role="mindie-ms-controller")  # as MindIE's controller does
    assert (await stub.Register(ci)).code == 0
    assert cd.brain.rank_faults(server) == []  # the controller handles it for 60 s
    # another level is not the MindIE default's
    await add_young(cd, npu_fault(node="node-s0-0", dev=0, code="80E18402", level="RestartNPU"))
    assert [f.level for f in cd.brain.rank_faults(server)] == ["RestartNPU"]


async def add_aged(cd, f: Fault, age_s: float) -> None:
    """Store ``f`` first seen ``age_s`` ago and wait until the brain's subscription took it."""
    t = now_ms() - int(age_s * 1000)
    await cd.center.upsert(
        Fault(f.source, f.node, f.device_type, f.device_id, f.code, f.level, "occur", t, t)
    )
    assert await cd.center.drain_sinks(5.0), "the fault center's subscribers did not catch up"
    for _ in range(200):
        if any(x.code == f.code for x in cd.brain.faults_of_node(f.node)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the brain never saw {f.code}")


async def test_mindie_rule_as_the_reference_processor_cases(cd, channel):
    """The reference's custom_filter_fault_processor_test.go cases on faultmesh's brain: a
    RestartRequest fault on a MindIE server's NPU is hidden only while it is at most 60 s old and
    the service's controller (jobId the service id, role mindie-ms-controller) is subscribed; a UB
    switch fault on the server's node likewise; another role, or a registration under a job id of
    the service, is no controller subscription."""
    jobs = {j.id: j for j in await apply_specs(cd, mindie_specs())}
    server = jobs[f"{MINDIE}-server-0"]
    stub = fault_pb2_grpc.FaultStub(channel)
    # registered, but not as the service's controller: not subscribed, so reported
    for ci in (
        fault_pb2.ClientInfo(jobId=MINDIE, role="mindie-ms-coordinator"),
        fault_pb2.ClientInfo(jobId=server.id, role="mindie-ms-controller"),
    ):
        assert (await stub.Register(ci)).code == 0
    await add_aged(cd, npu_fault(node="node-s0-0", dev=1, code="80C98009", level="RestartRequest"), 1)
    assert [f.code for f in cd.brain.rank_faults(server)] == ["80C98009"]
    assert (await stub.Register(fault_pb2.ClientInfo(jobId=MINDIE, role="mindie-ms-controller"))).code == 0
    assert cd.brain.rank_faults(server) == []  # within 60 s and the controller subscribed: hidden
    # older than 60 s: reported (the reference: durationMs > 60000)
    await add_aged(cd, npu_fault(node="node-s0-0", dev=0, code="80C98002", level="RestartRequest"), 61)
    assert [(f.rank, f.code) for f in cd.brain.rank_faults(server)] == [(0, "80C98002")]
    # a UnifiedBus switch fault on the server's node: hidden within its 60 s too
    switch = Fault("lingqu", "node-s0-0", "Switch", -1, "[0x08520003,na,L2,na]", "RestartRequest")
    await add_aged(cd, switch, 1)
    assert [f.code for f in cd.brain.rank_faults(server)] == ["80C98002"]
    # the other server's NPUs are not this one's: its fault shows on its own job only while young
    other = jobs[f"{MINDIE}-server-1"]
    await add_aged(cd, npu_fault(node="node-s1-0", dev=1, code="80C98009", level="RestartRequest"), 1)
    assert cd.brain.rank_faults(other) == []
    assert [f.code for f in cd.brain.rank_faults(server)] == ["80C98002"]
