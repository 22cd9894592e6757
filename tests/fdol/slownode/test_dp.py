"""Slow ranks of jobs without a TP group, from their data-parallel collectives (issue 34): the parse
stage's per-operation evidence, the arrival-lag rule, and bad input degrading to no verdict."""

from __future__ import annotations

import pytest
from slownode_dp import make_sim
from slownode_gen import dp_history
from slownode_realistic import FAULTMESH, detect, steps_of
from trainsim_dp import DPConf, DPLayout, DPSim
from trainsim_tp import Fault

from fdol.slownode.dp import ArrivalLagDetector, local_dp_groups
from fdol.slownode.featconf import FeatConfError, parse_featconf
from fdol.slownode.node import NodeDetector
from fdol.slownode.reader import Group
from fdol.slownode.records import BadInput
from fdol.slownode.replay import load_steps

FM = parse_featconf(FAULTMESH)
MS = 1_000_000


@pytest.mark.parametrize(("mode", "n_ops"), [("ddp", 3), ("fsdp", 15)])
def test_parse_records_each_data_parallel_collective_the_slow_card_arrives_last(tmp_path, mode, n_ops):
    """DDP (default group only): 4 gradient buckets; FSDP (a labelled dp group): 16 all-gathers
    (8 reduce-scatters). The first of the step is left out; the reference's TP columns stay empty
    (no TP group)."""
    sim = DPSim(DPLayout(8, mode), DPConf(seed=3), Fault("card", 5, 1.2, onset=0))
    sim.write_groups(tmp_path)
    sim.write_steps(tmp_path, 6)
    steps, bad = load_steps(tmp_path, list(range(8)))
    assert not bad
    for s in range(1, 5):
        ms = {r: steps[r][s] for r in range(8)}
        assert all(len(m.dp_starts) == len(m.dp_ops) == len(m.dp_gaps) == n_ops for m in ms.values())
        assert all(m.zp_device == 0 and m.tp_ops == () for m in ms.values())
        for k in range(1, n_ops):  # the +20 % card arrives last and waits least at every collective
            # (but FSDP's first kept all-gather: everyone issues it when the first one completed)
            assert max(range(8), key=lambda r, k=k: ms[r].dp_starts[k]) == 5
            assert min(range(8), key=lambda r, k=k: ms[r].dp_ops[k]) == 5


def test_parse_records_the_compute_between_expert_all_to_alls(tmp_path):
    """MoE (expert parallel over the node): 4 all-to-alls a layer, 8 layers forward and backward;
    the gap before each is the rank's own compute since the group left the previous one: the
    +25 % card's is the longest in most of them, whatever the routing skew."""
    sim = DPSim(DPLayout(8, "ddp", moe=True), DPConf(seed=4), Fault("card", 2, 1.25, onset=0))
    sim.write_groups(tmp_path)
    sim.write_steps(tmp_path, 6)
    steps, bad = load_steps(tmp_path, list(range(8)))
    assert not bad
    for s in range(1, 5):
        ms = [steps[r][s] for r in range(8)]
        assert all(len(m.ep_gaps) == 31 and len(m.dp_starts) == 3 for m in ms)
        longest = [max(range(8), key=lambda r, k=k: ms[r].ep_gaps[k]) for k in range(31)]
        assert longest.count(2) > 31 // 2


def test_local_groups_dp_label_first_default_group_else_and_tp_members_left_to_the_tp_rules():
    dflt = {"0": Group("0", "default_group", tuple(range(16)))}
    assert local_dp_groups(dflt, range(8), set()) == [list(range(8))]
    labelled = {**dflt, "dp_1": Group("dp_1", "dp", (0, 2, 4, 6)), "dp_2": Group("dp_2", "dp", (1, 3, 5, 7))}
    assert local_dp_groups(labelled, range(8), set()) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert local_dp_groups(labelled, range(8), {0, 2, 1, 3}) == [[4, 6], [5, 7]]
    assert local_dp_groups(dflt, [3], set()) == []  # one local rank: nobody to compare with
    staged = {**dflt, "pp_3": Group("pp_3", "pp", (0, 8)), "pp_4": Group("pp_4", "pp", (1, 9))}
    assert local_dp_groups(staged, range(8), set()) == [[2, 3, 4, 5, 6, 7]]  # stages not mixed
    ep = {**dflt, "ep_2": Group("ep_2", "exp", tuple(range(8)))}
    assert local_dp_groups(ep, range(8), set(), ("exp",)) == [list(range(8))]
    assert local_dp_groups(dflt, range(8), set(), ("exp",)) == []


def test_a_rank_lagging_its_peers_by_ten_percent_is_flagged_and_healthy_ranks_are_not():
    det = ArrivalLagDetector(window=40, excess=0.03)
    flagged, scores = det.evaluate([[0, 1, 2, 3]], dp_history(4, 40, slow=2))
    assert flagged == [2]
    assert 2.5 < scores[2] < 4  # a 10 % lag over a 3 % threshold
    assert max(scores[r] for r in (0, 1, 3)) < 0.5
    assert det.evaluate([[0, 1, 2, 3]], dp_history(4, 40))[0] == []
    assert det.evaluate([[0, 1, 2, 3]], dp_history(4, 39, slow=2))[0] == []  # the window is not full


def test_a_lag_within_the_peers_own_spread_is_not_named_one_beyond_it_is():
    """Eight cards whose speeds differ by -5 to +6 %: the slowest lags by more than the 3 % floor
    but not beyond 3 robust spreads of the members' lags; a +25 % card does."""
    speeds = [0.95, 0.97, 0.985, 1.0, 1.0, 1.01, 1.02, 1.06]
    hist = dp_history(8, 40)
    for r, sp in enumerate(speeds):
        for m in hist[r]:
            m.dp_starts = tuple(int(x * sp) for x in m.dp_starts)
    assert ArrivalLagDetector(excess=0.03, spread=0).evaluate([range(8)], hist)[0] == [7]
    assert ArrivalLagDetector(excess=0.03, spread=3.0).evaluate([range(8)], hist)[0] == []
    for m in hist[3]:
        m.dp_starts = tuple(int(x * 1.25) for x in m.dp_starts)
    assert ArrivalLagDetector(excess=0.03, spread=3.0).evaluate([range(8)], hist)[0] == [3]


def test_steps_with_missing_collectives_are_left_out_counted_never_a_verdict():
    bad = BadInput()
    det = ArrivalLagDetector(window=40, excess=0.03, bad=bad)
    skip = {(2, s) for s in range(0, 48, 2)}  # the slow rank lost a record in every other step
    flagged, _ = det.evaluate([[0, 1, 2, 3]], dp_history(4, 48, slow=2, skip=skip))
    assert flagged == [] and bad["missing_collectives"] == 24
    det.evaluate([[0, 1, 2, 3]], dp_history(4, 48, slow=2, skip=skip))
    assert bad["missing_collectives"] == 24  # each step counted once


def test_a_rank_that_stops_reporting_is_left_out_the_others_still_judged():
    nd = NodeDetector(FM, list(range(4)), "node-0")
    nd.set_rank_groups({0: {"0": Group("0", "default_group", (0, 1, 2, 3))}})
    hist = dp_history(4, 80, slow=1, factor=1.0)
    results = []
    for upto in range(4, 80, 5):
        for r in range(4):
            for m in hist[r][upto - 4 : upto + 1]:
                if not (r == 3 and m.step >= 20):  # rank 3 stops after step 19
                    nd.add(m)
        results.append(nd.round())
    last = results[-1]
    assert nd.bad["rank_stopped"] == 1
    assert all(r is None or r["slowCalculateRanks"] == [] for r in results)
    assert last is not None and set(last["dpLag"]) == {"0", "1", "2"}  # judged without rank 3


@pytest.mark.parametrize(("name", "want"), [("fsdp_card+20%", "correct"), ("ddp_card+20%", "correct")])
def test_a_plus_20_percent_card_in_a_job_without_tp_group_is_named(name, want):
    sim = make_sim(name, 16, 1)
    assert detect(make_sim(name, 16, 1), steps_of(sim, 1 << 30), FM)[0] == want


@pytest.mark.parametrize("name", ["ddp_healthy", "moe_fsdp_skew"])
def test_healthy_data_parallel_job_and_moe_routing_skew_name_nobody(name):
    sim = make_sim(name, 16, 1)
    assert detect(make_sim(name, 16, 1), steps_of(sim, 1 << 30), FM)[0] == "quiet"


def test_a_plus_25_percent_card_among_moe_routing_skew_is_named_and_only_it():
    sim = make_sim("moe_ddp_skew_card+25%", 16, 0)
    assert detect(make_sim("moe_ddp_skew_card+25%", 16, 0), steps_of(sim, 1 << 30), FM)[0] == "correct"


def test_dp_lag_excess_key():
    assert parse_featconf({"jobName": "j", "dpLagExcess": 0.05}).dp_lag_excess == 0.05
    assert parse_featconf({"jobName": "j", "dpLagSpread": 0}).dp_lag_spread == 0
    with pytest.raises(FeatConfError):
        parse_featconf({"jobName": "j", "dpLagExcess": 0})
    with pytest.raises(FeatConfError):
        parse_featconf({"jobName": "j", "dpLagSpread": -1})
