"""Sequential confirmation across steps, restarts and layout changes (issue 34)."""

from __future__ import annotations

from slownode_gen import Gen, dp_history
from slownode_realistic import FAULTMESH

from fdol.slownode.cluster import DegradationTracker
from fdol.slownode.featconf import FeatConfError, parse_featconf
from fdol.slownode.metrics import StepAssembler, StepMetrics
from fdol.slownode.node import NodeDetector
from fdol.slownode.reader import Group
from fdol.slownode.sequential import StepEvidence

FM = parse_featconf(FAULTMESH)
MS = 1_000_000
DDP = {"0": Group("0", "default_group", (0, 1, 2, 3))}


def test_the_statistic_passes_after_about_six_steps_over_and_never_at_one_in_three():
    ev = StepEvidence(6.0)
    assert [ev.feed(0, [s], [True]) for s in range(7)] == [False] * 6 + [True]
    ev.feed(0, range(7), [True] * 7)  # steps already fed are not counted again
    assert 6.0 <= ev.stat[0] < 7.0
    ev.feed(1, range(300), [s % 3 == 0 for s in range(300)])  # a healthy card over now and then
    assert not ev.passed(1) and ev.stat[1] < 1.0
    ev.feed(0, range(7, 300), [True] * 293)
    assert ev.stat[0] == 12.0  # held at twice the bound
    ev.feed(0, range(300, 305), [False] * 5)  # recovered: under the bound within a few steps
    assert not ev.passed(0)
    off = StepEvidence(0)
    assert not off.feed(0, range(50), [True] * 50) and not off.passed(0)


def _round_by_round(nd, hist, steps, every=5, skip=lambda r, m: False):
    out = []
    for upto in range(every - 1, steps, every):
        for r, ms in hist.items():
            for m in ms[upto - every + 1 : upto + 1]:
                if not skip(r, m):
                    nd.add(m)
        out.append(nd.round())
    return out


def _slow_from(hist, rank, onset, factor):
    for m in hist[rank][onset:]:
        m.dp_starts = tuple(int(x * factor) for x in m.dp_starts)


def test_a_slow_card_passes_the_bound_within_ten_steps_healthy_ranks_never():
    hist = dp_history(4, 60, seed=3)
    _slow_from(hist, 2, 30, 1.2)
    res = _round_by_round(_node(), hist, 60)
    first = next(i for i, r in enumerate(res) if r and r["seqRanks"])
    assert 30 <= 5 * first + 4 < 40  # confirmed by the round that ends 10 steps after onset
    assert all((r["seqRanks"] == [2]) == (i >= first) for i, r in enumerate(res))
    assert res[first]["slowCalculateRanks"] == [2] and "sequential" in res[first]["detectedBy"]
    healthy = _round_by_round(_node(), dp_history(4, 60, seed=3), 60)
    assert all(not r["seqRanks"] and not r["slowCalculateRanks"] for r in healthy)


def _node(conf=FM):
    nd = NodeDetector(conf, [0, 1, 2, 3], "node-0")
    nd.set_rank_groups({0: DDP})
    return nd


def test_seq_bound_key():
    assert parse_featconf({"jobName": "j"}).seq_bound == 6.0
    assert parse_featconf({"jobName": "j", "seqBound": 0}).seq_bound == 0
    try:
        parse_featconf({"jobName": "j", "seqBound": -1})
        raise AssertionError("accepted")
    except FeatConfError:
        pass
    hist = dp_history(4, 60, seed=3)
    _slow_from(hist, 2, 30, 1.2)
    off = _round_by_round(_node(parse_featconf({"jobName": "bench", "seqBound": 0})), hist, 60)
    assert all(not r["seqRanks"] for r in off)


def _slow_result(ranks, seq=()):
    return {"isSlow": 1, "slowCalculateRanks": list(ranks), "seqRanks": list(seq), "degradationLevel": "0.0%"}


def test_a_round_with_sequential_ranks_confirms_at_once_and_a_second_card_is_reported_later():
    conf = parse_featconf({"jobName": "j", "nConsecSlowRoundsToConfirm": 5})
    tr = DegradationTracker(conf)
    assert [a.kind for a in tr.on_round(_slow_result([2]))] == []  # window rule alone: one of five
    acts = tr.on_round(_slow_result([2], [2]))
    assert [(a.kind, a.ranks) for a in acts] == [("confirm", [2]), ("report", [2])]
    acts = tr.on_round(_slow_result([2, 5], [2, 5]))
    assert [(a.kind, a.ranks) for a in acts] == [("report", [2, 5])] and tr.reported_ranks == [2, 5]
    ref = DegradationTracker(parse_featconf({"jobName": "j", "rules": "reference"}))
    assert [a.kind for a in ref.on_round(_slow_result([2], [2]))] != ["confirm", "report"]


def _renumbered(hist, at):
    """The job restarts at step ``at``: steps from 1 again."""
    return {
        r: [
            StepMetrics(r, m.step - at + 1 if m.step >= at else m.step, 0, 0, dp_starts=m.dp_starts)
            for m in ms
        ]
        for r, ms in hist.items()
    }


def test_after_a_restart_baselines_re_form_and_a_slow_card_is_confirmed_as_in_a_fresh_job():
    hist = dp_history(4, 90, seed=4)
    _slow_from(hist, 1, 60, 1.2)  # 30 steps after the restart at step 30, as onset 30 in a fresh job
    nd = _node()
    res = _round_by_round(nd, _renumbered(hist, 30), 90)
    assert nd.restarts == 1
    first = next(i for i, r in enumerate(res) if r and r["seqRanks"])
    assert 60 <= 5 * first + 4 < 70 and res[first]["seqRanks"] == [1]
    assert all(r is None or not r["slowCalculateRanks"] for r in res[:first])  # quiet across it
    healthy = _node()
    assert all(
        r is None or not r["slowCalculateRanks"]
        for r in _round_by_round(healthy, _renumbered(dp_history(4, 90, seed=4), 30), 90)
    )


def test_ranks_that_stop_reporting_or_a_layout_change_give_no_verdict_counted():
    hist = dp_history(4, 80, seed=5)
    _slow_from(hist, 3, 15, 1.3)  # the slow rank is the one that stops at step 20
    nd = _node()
    res = _round_by_round(nd, hist, 80, skip=lambda r, m: r == 3 and m.step >= 20)
    assert nd.bad["rank_stopped"] == 1
    assert all(3 not in (r or {}).get("seqRanks", []) for r in res[-6:])  # left out, not named
    nd = _node()
    _round_by_round(nd, dp_history(4, 30, seed=5), 30)
    nd.set_rank_groups({0: {"0": Group("0", "default_group", (0, 1, 2))}})  # rank 3 left the group
    assert nd.bad["layout_changed"] == 1 and all(not h for h in nd.history.values())
    nd.set_rank_groups({0: {"0": Group("0", "default_group", (0, 1, 2))}})  # the same again: no change
    assert nd.bad["layout_changed"] == 1


def test_the_assembler_numbers_anew_after_a_restart_and_still_drops_a_repeated_step():
    g = Gen()
    t = g.step(1, 10_000_000, 1000)
    t = g.step(2, t + 10, 1000)
    t = g.step(3, t + 10, 1000)
    t = g.step(1, t + 60_000 * MS, 1000)  # the job restarted a minute later
    t = g.step(2, t + 10, 1000)
    g.step(3, t + 10, 1000)
    a = StepAssembler(0)
    out = a.feed(g.records) + a.flush()
    assert [m.step for m in out] == [1, 2, 3, 1, 2, 3] and a.restarts == 1
    assert not a.bad.get("step_out_of_order")
