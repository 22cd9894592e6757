"""Issue 32 item 5: relation rules per job in clusterd (the reference's relation_fault_processor.go and
its tests: a trigger and its relation fault on two nodes of one job pair; Separate dominates
SubHealth; an A3 job's CQE trigger is no trigger; an UnHealthy card contributes nothing; a relation
fault past its deadline is not matched; the outcome leaves with the relation fault)."""

from __future__ import annotations

import json
from pathlib import Path

from support import eventually, make_clusterd

from clusterd.relations import SOURCE, JobRelations
from faultmesh.faultrules import DurationTable, RelationTable
from faultmesh.jobspec import Job, Rank
from faultmesh.model import Fault, now_ms

DATA = Path(__file__).resolve().parents[2] / "services" / "deviced" / "data"
LINK_DOWN, HCCL_SEP, HCCL_SUB, CQE = "81078603", "8C1F860B", "8C1F8609", "8C1F8608"
L2 = "[0x08520003,na,L2,na]"


def tables():
    rel = RelationTable.from_obj(json.loads((DATA / "relationFaultCustomization.json").read_text()))
    dur = DurationTable.from_obj(json.loads((DATA / "faultDuration.json").read_text()))
    return rel, dur


def job(spid: int = -1) -> Job:
    ranks = [Rank(i, node, dev, spid) for i, (node, dev) in enumerate(
        [("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1)])]  # fmt: skip
    return Job("job-1", "llama", ranks=tuple(ranks))


def npu(node, dev, code, level="RestartRequest"):
    return Fault("deviced", node, "NPU", dev, code, level, first_seen_ms=1, last_seen_ms=1)


def rules(jobs=None, health=lambda n, d: ""):
    return JobRelations(*tables(), (lambda: jobs if jobs is not None else [job()]), health)


def test_trigger_on_one_node_pairs_with_relation_on_another():
    r = rules()
    out = r.evaluate([npu("node-a", 0, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000)
    (f,) = out["node-b"].values()
    assert (f.source, f.node, f.device_type, f.device_id, f.code, f.level) == (
        SOURCE,
        "node-b",
        "NPU",
        1,
        LINK_DOWN,
        "SeparateNPU",
    )
    assert f.attributes == {"job": "job-1", "trigger": HCCL_SEP, "strategy": "Separate"}
    assert "node-a" not in out


def test_separate_dominates_subhealth_and_holds():
    r = rules()
    out = r.evaluate([npu("node-a", 0, HCCL_SUB), npu("node-b", 1, LINK_DOWN)], 1000)
    assert next(iter(out["node-b"].values())).level == "SubHealthFault"
    out = r.evaluate(
        [npu("node-a", 0, HCCL_SUB), npu("node-a", 1, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 2000
    )
    assert next(iter(out["node-b"].values())).level == "SeparateNPU"
    out = r.evaluate([npu("node-a", 0, HCCL_SUB), npu("node-b", 1, LINK_DOWN)], 3000)  # kept until it leaves
    assert next(iter(out["node-b"].values())).level == "SeparateNPU"
    assert r.evaluate([npu("node-a", 0, HCCL_SUB)], 4000) == {}


def test_not_paired_outside_the_job_or_on_the_same_node():
    r = rules()
    assert (
        r.evaluate([npu("node-c", 0, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000) == {}
    )  # not the job's node
    assert (
        r.evaluate([npu("node-a", 5, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000) == {}
    )  # not the job's NPU
    # trigger and relation on one node: deviced's per-node stage decides it, clusterd adds nothing
    assert r.evaluate([npu("node-b", 0, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000) == {}
    assert rules(jobs=[]).evaluate([npu("node-a", 0, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000) == {}


def test_deadline_cqe_on_a3_and_unhealthy_card():
    r = rules()
    assert r.evaluate([npu("node-b", 1, LINK_DOWN)], 1000) == {}
    # the trigger comes after the 300 s deadline: no match
    assert r.evaluate([npu("node-a", 0, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000 + 300_000) == {}
    a3 = rules(jobs=[job(spid=0)])
    assert a3.evaluate([npu("node-a", 0, CQE), npu("node-b", 1, LINK_DOWN)], 1000) == {}
    plain = rules()
    assert plain.evaluate([npu("node-a", 0, CQE), npu("node-b", 1, LINK_DOWN)], 1000)["node-b"]
    sick = rules(health=lambda n, d: "UnHealthy" if (n, d) == ("node-a", 0) else "Healthy")
    assert sick.evaluate([npu("node-a", 0, HCCL_SEP), npu("node-b", 1, LINK_DOWN)], 1000) == {}


def test_switch_relation_fault_raised_on_the_other_node():
    r = rules()
    sw = Fault("lingqu", "node-b", "Switch", 3, L2, "SubHealthFault", first_seen_ms=1, last_seen_ms=1)
    (f,) = r.evaluate([npu("node-a", 1, HCCL_SEP), sw], 1000)["node-b"].values()
    assert (f.device_type, f.device_id, f.code, f.level) == ("Switch", 3, L2, "Separate")


async def test_clusterd_submits_relation_faults_to_the_center(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        await cd.jobs.apply([job()])
        await cd.center.replace_source("node-a", "deviced", [npu("node-a", 0, HCCL_SEP)])
        await cd.center.replace_source("node-b", "deviced", [npu("node-b", 1, LINK_DOWN)])

        def relation():
            return [f for f in cd.center.faults() if f.source == SOURCE]

        (f,) = await eventually(relation, what="relation fault submitted")
        assert (f.node, f.device_id, f.level) == ("node-b", 1, "SeparateNPU")
        await cd.center.replace_source("node-b", "deviced", [])
        await eventually(lambda: not relation(), what="relation fault gone with its cause")
        # the trigger's card UnHealthy (the agent's device view: logic 7 is phy 0): no pairing
        view = {"device_type": "NPU", "device_id": 7, "phy_id": 0, "health": "UnHealthy"}
        cd.nodes.update("node-a", devices=[view], owner="deviced")
        await cd.center.replace_source("node-b", "deviced", [npu("node-b", 1, LINK_DOWN)])
        comp = next(c for c in cd.components if c.name == "relations")
        await eventually(
            lambda: any(k[1].node == "node-b" for k in comp.rules.watched), what="the new fault evaluated"
        )
        assert comp.rules.evaluate(cd.center.faults(), now_ms()) == {} and not relation()
        cd.nodes.update("node-a", devices=[{**view, "health": "Healthy"}], owner="deviced")
        assert comp.rules.evaluate(cd.center.faults(), now_ms())["node-b"]  # the same faults, a healthy card
    finally:
        await cd.stop()


# The reference's own cases (relation_fault_processor_test.go), its codes 0x0001.. as 8-digit codes:
# trigger T1 + relations {R2, R3} -> SubHealth; trigger T2 + relation {R4} -> Separate.
T1, T2, R2, R3, R4 = "80000001", "80000002", "80000012", "80000013", "80000014"


def reference_rules(strategy_a="SubHealth"):
    rel = RelationTable.from_obj([
        {"TriggerFault": T1, "RelationFaults": [R2, R3], "FaultStrategy": strategy_a},
        {"TriggerFault": T2, "RelationFaults": [R4], "FaultStrategy": "Separate"},
    ])  # fmt: skip
    dur = DurationTable.from_obj(
        [{"FaultCode": c, "FaultType": "faultDevice", "TimeOutInterval": 1000} for c in (R2, R3, R4)]
    )
    nodes = ["node-100", "node-101", "node-102", "node-103"]
    j = Job(
        "job-r",
        "r",
        ranks=tuple(Rank(i, n, d) for i, (n, d) in enumerate((n, d) for n in nodes for d in (1, 2))),
    )
    return JobRelations(rel, dur, lambda: [j])


def strategies(out):
    return {(f.node, f.device_type, f.device_id, f.code): f.level for fs in out.values() for f in fs.values()}


def test_reference_no_trigger_and_not_all_relation_faults():
    r = reference_rules("Separate")
    assert (
        r.evaluate([npu("node-101", 1, R2), npu("node-101", 2, R3)], 1000) == {}
    )  # TestNoTriggerNetworkFault
    # TestNotAllNetworkInRelationFaults: R2 and R4 present, the rule needs R2 and R3
    assert r.evaluate([npu("node-100", 1, R2), npu("node-101", 2, R4), npu("node-102", 2, T1)], 1000) == {}


def test_reference_right_node_and_device_separate():
    r = reference_rules("Separate")
    sw = Fault("lingqu", "node-103", "Switch", 0, R3, "NotHandle", first_seen_ms=1, last_seen_ms=1)
    out = r.evaluate([npu("node-100", 1, R2), npu("node-101", 2, R3), sw, npu("node-102", 2, T1)], 1000)
    assert strategies(out) == {
        ("node-100", "NPU", 1, R2): "SeparateNPU",
        ("node-101", "NPU", 2, R3): "SeparateNPU",
        ("node-103", "Switch", 0, R3): "Separate",  # the reference's node-level Separate
    }


def test_reference_device_subhealth_and_separate():
    r = reference_rules()
    sw = Fault("lingqu", "node-103", "Switch", 0, R4, "NotHandle", first_seen_ms=1, last_seen_ms=1)
    faults = [npu("node-100", 1, R2), npu("node-101", 2, R3), npu("node-100", 1, R4), sw,
              npu("node-102", 2, T1), npu("node-102", 2, T2)]  # fmt: skip
    assert strategies(r.evaluate(faults, 1000)) == {
        ("node-100", "NPU", 1, R2): "SubHealthFault",
        ("node-101", "NPU", 2, R3): "SubHealthFault",
        ("node-100", "NPU", 1, R4): "SeparateNPU",  # npu1 of node-100: Separate wins on the chip
        ("node-103", "Switch", 0, R4): "Separate",
    }


async def test_restored_relation_faults_no_longer_due_are_removed():
    r = rules()
    stale = Fault(SOURCE, "node-b", "NPU", 1, LINK_DOWN, "SeparateNPU", first_seen_ms=1, last_seen_ms=1)
    r.seed([stale, npu("node-b", 1, LINK_DOWN)])  # what the fault center restored after a restart
    submitted = []

    async def submit(node, faults):
        submitted.append((node, faults))

    assert await r.sync([npu("node-b", 1, LINK_DOWN)], 1000, submit) == 1  # the trigger is gone
    assert submitted == [("node-b", [])] and r.outcome == {}
    assert await r.sync([npu("node-b", 1, LINK_DOWN)], 2000, submit) == 0  # nothing more to say
