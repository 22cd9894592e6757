"""Node-level rounds (§4) and cluster-level merge + confirmation (§5–6), hand-computed values."""

from __future__ import annotations

from fdol.slownode.cluster import ClusterDetector, DegradationTracker, merge_cluster, pp_link_analysis
from fdol.slownode.featconf import parse_featconf
from fdol.slownode.metrics import StepMetrics
from fdol.slownode.node import NodeDetector
from fdol.slownode.reader import Group

CONF = parse_featconf(
    {
        "jobName": "j",
        "normalNumber": 8,
        "nConsecAnomaliesSignifySlow": 2,
        "degradationPercentage": 0.3,
        "patternDetector": False,
        "rules": "reference",
    }
)
GROUPS = {
    "tp_1": Group("tp_1", "tp", (0, 1)),
    "pp_2": Group("pp_2", "pp", (0, 2)),
    "pp_3": Group("pp_3", "pp", (1, 3)),
}


def m(rank, step, st=100, zp=10, zph=10, pp=5, dl=50, compute=60):
    return StepMetrics(
        rank,
        step,
        0,
        0,
        step_time=st,
        zp_device=zp,
        zp_host=zph,
        pp_device=pp,
        dataloader_host=dl,
        compute=compute,
    )


def node(conf=CONF):
    n = NodeDetector(conf, [0, 1], "10.0.0.1")
    n.set_rank_groups({0: GROUPS, 1: GROUPS})
    for s in range(8):
        n.add(m(0, s))
        n.add(m(1, s))
    return n


def test_round_needs_new_steps_and_reports_baseline():
    n = node()
    r = n.round()
    assert r["isSlow"] == 0 and r["degradationLevel"] == "0.0%" and r["lastStep"] == 7
    assert r["baselineReady"] and r["nodeRank"] == "10.0.0.1" and r["jobId"] == "j"
    assert r["parallelGroups"]["tp_1"] == {"group_name": "tp", "global_ranks": [0, 1]}
    assert n.round() is None  # nothing new
    n.add(m(0, 8))
    assert n.round() is None  # the slowest rank (1) did not advance
    assert n.tp_groups() == [[0, 1]]


def test_slow_compute_card_tp_domain_pp_host_io_rules():
    n = node()
    n.round()
    # steps 8, 9: every step time 140 (+40 %); rank 0 waits least in the TP all-reduce (slow card);
    # rank 1 sends slower on PP; rank 1's dataloader slower.
    for s in (8, 9):
        n.add(m(0, s, st=140, zp=4, zph=4))
        n.add(m(1, s, st=140, zp=20, zph=20, pp=9, dl=80))
    r = n.round()
    assert r["isSlow"] == 1 and r["degradationLevel"] == "40.00%"
    assert r["slowCalculateRanks"] == [0]
    assert r["slowCommunicationDomains"] == []  # rank 0's TP time is not slower than its history
    assert r["slowSendRanks"] == [1]  # 9 > 5*1.3
    assert r["slowHostNodes"] == []  # not every rank's host TP time is slow
    assert r["slowIORanks"] == [1]  # fix: computed although the host is not slow
    assert r["detectedBy"] == ["stepTime"]


def test_slow_tp_domain_and_slow_host():
    n = node()
    n.round()
    for s in (8, 9):
        n.add(m(0, s, st=150, zp=20, zph=20, dl=80))
        n.add(m(1, s, st=150, zp=21, zph=21, dl=80))
    r = n.round()
    assert r["degradationLevel"] == "50.00%"
    assert r["slowCalculateRanks"] == []  # ratio 21/20 <= 1.3: no outlier card
    assert r["slowCommunicationDomains"] == [[0, 1]]
    assert r["slowHostNodes"] == ["10.0.0.1"]
    assert r["slowIORanks"] == []  # explained by the slow host


def test_not_slow_without_step_time_degradation():
    n = node()
    n.round()
    for s in (8, 9):
        n.add(m(0, s, st=120, zp=4))
        n.add(m(1, s, st=120, zp=20))
    r = n.round()
    assert r["isSlow"] == 0 and r["slowCalculateRanks"] == []


def test_pattern_detector_catches_compute_straggler_under_step_gate():
    conf = parse_featconf(
        {
            "jobName": "j",
            "normalNumber": 8,
            "nConsecAnomaliesSignifySlow": 2,
            "patternWindowSteps": 6,
            "rules": "pattern",
        }
    )
    n = node(conf)
    for s in range(8, 14):
        n.add(m(0, s, st=110, zp=10, compute=60))
        n.add(m(1, s, st=110, zp=2, compute=75))  # compute ratio 1.25, wait ratio 5
    r = n.round()
    assert r["isSlow"] == 1 and r["slowCalculateRanks"] == [1] and r["detectedBy"] == ["pattern"]
    assert r["degradationLevel"] == "25.00%"
    assert r["pattern"]["1"] == [1.25, 5.0]
    for s in range(14, 20):
        n.add(m(0, s, st=110, zp=0, compute=60))
        n.add(m(1, s, st=110, zp=0, compute=75))
    r = n.round()
    assert r["isSlow"] == 0 and r["suspectRanks"] == [1]


def test_pp_link_analysis_golden():
    assert pp_link_analysis([1, 2, 3, 4, 5, 6], [1, 2, 3]) == [3]
    assert pp_link_analysis([1, 2, 3, 4, 5, 6], [1]) == [1]
    assert pp_link_analysis([1, 2], [2]) == []  # the last stage sends nowhere


def test_merge_cluster():
    groups = {
        "tp_1": {"group_name": "tp", "global_ranks": [0, 1]},
        "tp_2": {"group_name": "tp", "global_ranks": [2, 3]},
        "pp_3": {"group_name": "pp", "global_ranks": [0, 2]},
        "pp_4": {"group_name": "pp", "global_ranks": [1, 3]},
    }
    a = {
        "isSlow": 1,
        "degradationLevel": "35.12%",
        "nodeRank": "a",
        "slowCalculateRanks": [1],
        "slowCommunicationDomains": [[0, 1]],
        "slowSendRanks": [0],
        "slowHostNodes": [],
        "slowIORanks": [],
        "parallelGroups": groups,
    }
    b = {
        "isSlow": 1,
        "degradationLevel": "40.00%",
        "nodeRank": "b",
        "slowCalculateRanks": [3],
        "slowCommunicationDomains": [[2]],
        "slowSendRanks": [],
        "slowHostNodes": ["b"],
        "slowIORanks": [2],
        "suspectRanks": [],
        "parallelGroups": groups,
    }
    c = {"isSlow": 0, "degradationLevel": "0.0%", "nodeRank": "c", "suspectRanks": [5]}
    r = merge_cluster("j", "cl", [a, b, c], [a, b, c])
    assert r["isSlow"] == 1 and r["degradationLevel"] == "40.00%"
    assert r["slowCalculateRanks"] == [1, 3]
    assert r["slowCommunicationDomains"] == [[0, 1], [0, 2]]  # tp_2 not fully slow; PP link 0->2
    assert r["slowCommunicationRanks"] == []  # 2-stage PP: both ends fully bad, no 0.5 neighbour
    assert r["slowHostNodes"] == ["b"] and r["slowIORanks"] == [2] and r["suspectRanks"] == [5]
    assert r["slowNodes"] == ["a", "b"]


def test_cluster_detector_rounds_only_on_change():
    cd = ClusterDetector("j")
    assert cd.round() is None
    cd.add_report("a", {"isSlow": 0, "baselineReady": True})
    assert cd.round()["isSlow"] == 0
    assert cd.round() is None
    assert cd.all_baseline_ready(["a"]) and not cd.all_baseline_ready(["a", "b"])


def slow(ranks=(2,)):
    return {"isSlow": 1, "slowCalculateRanks": list(ranks), "suspectRanks": []}


NOT = {"isSlow": 0, "suspectRanks": []}


def kinds(actions):
    return [a.kind for a in actions]


def test_tracker_initial_phase_confirmation_and_recovery():
    t = DegradationTracker(CONF)
    assert t.heavy and t.heavy_reason == "initial"
    assert kinds(t.on_round(NOT, baseline_ready=False)) == []
    assert kinds(t.on_round(NOT, baseline_ready=True)) == ["heavy_off"]
    assert kinds(t.on_round(slow())) == ["heavy_on"]  # first slow round
    for _ in range(3):
        assert kinds(t.on_round(slow())) == []
    acts = t.on_round(slow())  # 5th consecutive slow round
    assert kinds(acts) == ["confirm", "report", "heavy_off"] and acts[1].ranks == [2]
    assert t.degraded
    assert kinds(t.on_round(slow())) == []  # already degraded
    assert kinds(t.on_round({"isSlow": 0, "suspectRanks": [2]})) == []  # still straggling
    for _ in range(4):  # recovery needs 5 consecutive clean rounds (hysteresis)
        assert kinds(t.on_round(NOT)) == []
    assert kinds(t.on_round(slow())) == []  # resets the clean count
    for _ in range(4):
        assert kinds(t.on_round(NOT)) == []
    acts = t.on_round(NOT)
    assert kinds(acts) == ["recover"] and acts[0].ranks == [2] and not t.degraded


def test_tracker_interrupted_slow_rounds_restart_count():
    t = DegradationTracker(CONF)
    t.on_round(NOT)
    t.on_round(slow())
    t.on_round(slow())
    assert kinds(t.on_round(NOT)) == ["heavy_off"]
    for _ in range(4):
        t.on_round(slow())
    assert not t.degraded
    assert kinds(t.on_round(slow())) == ["confirm", "report", "heavy_off"]


def test_tracker_deferred_report_and_suspect_heavy():
    t = DegradationTracker(CONF, suspect_max_rounds=2, suspect_cooldown_rounds=3)
    t.on_round(NOT)
    sus = {"isSlow": 0, "suspectRanks": [2]}
    assert kinds(t.on_round(sus)) == ["heavy_on"] and t.heavy_reason == "suspect"
    assert kinds(t.on_round(sus)) == []
    assert kinds(t.on_round(sus)) == ["heavy_off"]  # nothing found in 2 rounds
    assert kinds(t.on_round(sus)) == []  # cooldown
    assert kinds(t.on_round(sus)) == []
    assert kinds(t.on_round(sus)) == ["heavy_on"]
    for _ in range(4):
        t.on_round(slow(()))
    acts = t.on_round(slow(()))
    assert kinds(acts) == ["confirm"] and t.heavy  # ranks unknown: keep profiling
    acts = t.on_round(slow((3,)))
    assert kinds(acts) == ["report", "heavy_off"] and acts[0].ranks == [3]


def test_tracker_reports_majority_ranks_only():
    t = DegradationTracker(CONF)
    t.on_round(NOT)
    for ranks in ([0], [0, 2], [3], [0], ()):
        acts = t.on_round(slow(ranks))
    assert kinds(acts) == ["confirm", "report", "heavy_off"] and acts[1].ranks == [0]
    t = DegradationTracker(CONF)
    t.on_round(NOT)
    for ranks in ([1], [2], [3], [4], [5]):
        acts = t.on_round(slow(ranks))
    assert kinds(acts) == ["confirm"] and t.deferred  # no agreement: not reported


def test_tracker_a_card_named_once_beside_a_slow_loader_is_not_reported():
    """A slow data loader named in every confirming round; its TP partner was named as a slow card
    in one of them (its noise): the confirmation names the IO rank and reports no card."""
    t = DegradationTracker(CONF)
    t.on_round(NOT)
    for ranks in ((), (3,), (), (), ()):
        acts = t.on_round({**slow(ranks), "slowIORanks": [1]})
    assert kinds(acts) == ["confirm"] and acts[0].ranks == []
    assert acts[0].detail["slowIORanks"] == [1]


def test_bad_input_never_makes_a_false_detection(tmp_path):
    """A clean 2-rank job whose files are full of garbage, truncated JSON, unknown names, negative
    durations, missing ends, a clock jump, a broken parallel_group.json and a vanishing rank
    directory: everything is counted per reason and no round is slow."""
    import json
    import random
    import shutil

    from fdol.slownode.metrics import StepAssembler
    from fdol.slownode.reader import JobReader
    from fdol.slownode.records import encode_record

    rng = random.Random(3)
    job = tmp_path / "job"
    for r in (0, 1):
        (job / str(r)).mkdir(parents=True)
        (job / str(r) / "parallel_group.json").write_text(
            json.dumps({"tp_1": {"group_name": "tp", "group_rank": r, "global_ranks": [0, 1]}})
        )
    (job / "1" / "parallel_group.json").write_text("{broken")
    garbage = [
        b"garbage\n",
        b'{"Kind":1,"Flag":2,"Sour\n',
        encode_record(2, 0, 5, 10**9, "forward", "default") + encode_record(4, 0, 3, 10**9),  # negative
        encode_record(2, 0, 5, 10**9 + 5, "mystery", "default")
        + encode_record(4, 0, 8, 10**9 + 5),  # unknown
        encode_record(32, 0, 7, 10**9 + 1),  # end without start
        encode_record(16, 0, 9, 10**9 + 2, "forward", "default"),  # start without end
    ]
    conf = parse_featconf(
        {"jobName": "j", "normalNumber": 8, "nConsecAnomaliesSignifySlow": 2, "patternWindowSteps": 8}
    )
    nd = NodeDetector(conf, [0, 1], "n")
    jr = JobReader(job, [0, 1])
    asm = {r: StepAssembler(r, lambda r=r: jr.groups(r), bad=jr.bad) for r in (0, 1)}
    t = 10**12
    rid = 1
    for step in range(60):
        for r in (0, 1):
            lines = [rng.choice(garbage) for _ in range(2)]
            st = t if step != 30 else t - 10**10  # one clock jump backwards
            c = int(60e6 * (1 + rng.gauss(0, 0.03)))
            lines += [encode_record(16, 0, st, rid, f"step {step}", "default"), encode_record(16, 1, st, rid)]
            lines += [
                encode_record(16, 0, st + 1, rid + 1, "forward", "default"),
                encode_record(16, 1, st + 1, rid + 1),
                encode_record(32, 1, st + c, rid + 1),
                encode_record(32, 0, st + c, rid + 1),
            ]
            name = json.dumps({"opName": "AllReduce", "groupName": "tp_1", "count": "10"})
            lines += [
                encode_record(16, 0, st + c + 1, rid + 2, name, "communication"),
                encode_record(16, 1, st + c + 1, rid + 2),
                encode_record(32, 1, st + c + 5_000_000, rid + 2),
                encode_record(32, 0, st + c + 5_000_000, rid + 2),
            ]
            lines += [encode_record(32, 1, st + 70_000_000, rid), encode_record(32, 0, st + 70_000_000, rid)]
            rid += 3
            if (job / str(r)).is_dir():
                with open(job / str(r) / "1000", "ab") as fh:
                    fh.write(b"".join(lines))
        t += 71_000_000
        if step == 40:
            shutil.rmtree(job / "0")  # the rank directory disappears for a while
        if step == 45:
            (job / "0").mkdir()
        recs = jr.poll()
        nd.set_rank_groups({r: g for r in (0, 1) if (g := jr.groups(r))})
        for r, rs in recs.items():
            for m in asm[r].feed(rs):
                nd.add(m)
        res = nd.round()
        assert res is None or res["isSlow"] == 0, res
    b = jr.bad
    for reason in (
        "bad_json",
        "unknown_name",
        "orphan_end",
        "negative_duration",
        "bad_parallel_group",
        "rank_dir_missing",
        "clock_jump",
    ):
        assert b[reason] > 0, (reason, dict(b))
    assert nd.last_detected_step >= 40


def test_homogenized_card_needs_compute_corroboration_with_pattern_on():
    conf = parse_featconf(
        {
            "jobName": "j",
            "normalNumber": 8,
            "nConsecAnomaliesSignifySlow": 2,
            "patternWindowSteps": 4,
            "rules": "pattern",
        }
    )
    for c0, expected in ((60, []), (75, [0])):
        n = node(conf)
        n.round()
        for s in (8, 9):
            n.add(m(0, s, st=140, zp=4, compute=c0))
            n.add(m(1, s, st=140, zp=20))
        r = n.round()
        assert r["isSlow"] == 1 and "stepTime" in r["detectedBy"]
        assert r["slowCalculateRanks"] == expected, (c0, r["pattern"])


def test_tracker_initial_phase_is_bounded():
    t = DegradationTracker(CONF, initial_max_rounds=3)
    assert kinds(t.on_round(NOT, baseline_ready=False)) == []
    assert kinds(t.on_round(NOT, baseline_ready=False)) == []
    assert kinds(t.on_round(NOT, baseline_ready=False)) == ["heavy_off"]


def test_tracker_keeps_profiling_on_while_a_straggler_is_suspected():
    t = DegradationTracker(CONF, suspect_max_rounds=3)
    t.on_round(NOT)
    sus = {"isSlow": 0, "suspectRanks": [2]}
    assert kinds(t.on_round(slow())) == ["heavy_on"]
    assert kinds(t.on_round(sus)) == [] and t.heavy and t.heavy_reason == "suspect"  # no flapping
    assert kinds(t.on_round(slow())) == [] and t.slow_rounds == 1  # consecutive count restarted
    assert kinds(t.on_round(NOT)) == ["heavy_off"]


FM = parse_featconf(
    {"jobName": "j", "normalNumber": 8, "nConsecAnomaliesSignifySlow": 2, "degradationPercentage": 0.3}
)


def _fm_host_round(zp, zph):
    n = node(FM)
    n.round()
    for s in range(8, 8 + FM.time_window):
        n.add(m(0, s, st=150, zp=zp, zph=zph))
        n.add(m(1, s, st=150, zp=zp, zph=zph))
    return n.round()


def test_host_only_producer_reports_no_slow_host():
    """A CPU job's TP time on the host is its TP time on the device, step for step: both rising
    is no slow host (the TP-domain rule reads that series); the host side rising alone is one."""
    assert _fm_host_round(zp=20, zph=20)["slowHostNodes"] == []
    assert _fm_host_round(zp=10, zph=20)["slowHostNodes"] == ["10.0.0.1"]


def test_two_nodes_slow_tp_domain_must_clear_nsigma_of_its_noise():
    """With two nodes the other is the only baseline: node a's TP waits rising x1.5 against node b's
    x1.0 is a slow domain on quiet nodes (spread 1 %), but inside 3 spreads of a noisy pair
    (spread 20 %: a shared box's load change slows one "node"'s collectives first)."""

    def merged(spread):
        def rep(name, ranks, rise, slow):
            return {
                "isSlow": int(slow),
                "nodeRank": name,
                "ranks": ranks,
                "slowCommunicationDomains": [ranks] if slow else [],
                "rise": {
                    str(r): {"zp": rise, "zpSpread": spread, "host": 1.0, "hostSpread": spread} for r in ranks
                },
            }

        a, b = rep("a", [0, 1], 1.5, True), rep("b", [2, 3], 1.0, False)
        return merge_cluster("j", "cl", [a, b], [a, b], groups=([[0, 1], [2, 3]], []))

    assert merged(0.01)["slowCommunicationDomains"] == [[0, 1]]
    assert merged(0.2)["slowCommunicationDomains"] == []
