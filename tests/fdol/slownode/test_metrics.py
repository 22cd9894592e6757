"""Per-step metrics (reference fdol.md §2) from hand-built records, values computed by hand."""

from __future__ import annotations

from slownode_gen import Gen

from fdol.slownode.metrics import StepAssembler, parse_comm_name, rank_group
from fdol.slownode.reader import Group
from fdol.slownode.records import Record

GROUPS = {
    "tp_1": Group("tp_1", "tp", (0, 1)),
    "pp_2": Group("pp_2", "pp", (0, 4)),
    "dp_3": Group("dp_3", "dp", (0, 2)),
}


def test_rank_group_and_comm_name():
    assert rank_group(GROUPS, 0, "tp") == "tp_1"
    assert rank_group(GROUPS, 0, "pp") == "pp_2"
    assert rank_group(GROUPS, 3, "tp") is None
    assert (
        rank_group({"a_10": Group("a_10", "tp", (0, 1)), "a_9": Group("a_9", "tp", (0, 1))}, 0, "tp") == "a_9"
    )
    assert parse_comm_name('{"opName":"HcclAllReduce","groupName":"g","count":"12"}') == (
        "hcclallreduce",
        "g",
        12,
    )
    assert parse_comm_name("{oops") is None
    assert parse_comm_name('{"opName":"x","groupName":"g","count":"many"}') is None


def test_step_metrics_hand_computed():
    g = Gen()
    t = 1_000_000
    # step 1: dataloader 100, forward 1000, TP all-reduces 300, 200, 400, 600 (skip first -> 200,400,600),
    # two PP sends 50, 70.
    t = g.step(1, t, 5000, dl=100, fwd=1000, tp=[300, 200, 400, 600], pp=[50, 70]) + 10
    g.step(2, t, 3000, fwd=500, tp=[250])
    g.step(3, t + 4000, 3000)
    a = StepAssembler(0, lambda: GROUPS)
    out = a.feed(g.records)
    assert [m.step for m in out] == [1, 2]
    m = out[0]
    assert m.step_time == 5000
    assert m.zp_device == round((200 + 400 + 600) / 3) == 400
    assert m.zp_host == 400
    assert m.pp_device == 50
    assert m.pp_host == 60
    assert m.dataloader_host == 100
    assert m.compute == 1000
    assert m.comm_wait == 300 + 200 + 400 + 600 + 50 + 70
    # one TP op in the step: it is used (fix of the reference's skip-first quirk)
    assert out[1].zp_device == 250 and out[1].compute == 500
    assert [m.step for m in a.flush()] == [3]
    assert sum(a.bad.values()) == 0


def test_host_only_producer_and_no_groups():
    recs = [
        Record(2, 0, 100, 1, "step 5", "default"),
        Record(2, 0, 110, 2, "forward", "default"),
        Record(4, 0, 150, 2, "", ""),
        Record(4, 0, 300, 1, "", ""),
        Record(2, 0, 310, 3, "step 6", "default"),
    ]
    a = StepAssembler(0)
    out = a.feed(recs)
    assert len(out) == 1 and out[0].step == 5 and out[0].step_time == 200 and out[0].compute == 40
    assert out[0].zp_device == 0 and out[0].pp_device == 0


def test_bad_records_counted_never_crash():
    g = Gen()
    g.records += [
        Record(4, 0, 50, 999, "", ""),  # end without start
        Record(2, 0, 60, 998, "mystery", "default"),
        Record(4, 0, 70, 998, "", ""),  # unknown name
        Record(2, 0, 80, 997, "step x", "default"),
        Record(4, 0, 90, 997, "", ""),  # bad step name
        Record(2, 0, 100, 996, "forward", "default"),
        Record(4, 0, 95, 996, "", ""),  # negative duration
        Record(16, 0, 100, 995, "{bad json", "communication"),
        Record(32, 0, 120, 995, "", ""),
    ]
    t = g.step(1, 1000, 500)
    t = g.step(2, t + 10, 500)
    g.records.append(Record(16, 0, t + 10, 500, "step 3", "default"))  # never ends
    g.step(4, t + 2000, 500)
    g.step(5, t + 3000, 500)
    g.step(6, t + 4000, 500)
    a = StepAssembler(0)
    out = a.feed(g.records)
    assert [m.step for m in out] == [1, 2, 4, 5]
    b = a.bad
    assert b["orphan_end"] == 1 and b["unknown_name"] == 1 and b["bad_step_name"] == 1
    assert b["negative_duration"] == 1 and b["bad_comm_name"] == 1 and b["missing_end"] == 1


def test_clock_jump_and_out_of_order_steps_dropped():
    g = Gen()
    t = g.step(1, 10_000_000, 1000)
    g.step(2, t + 10, 1000)
    g.step(3, 1_000, 1000)  # clock went backwards by ~10 ms
    g.step(4, t + 5000, 1000)
    g.step(2, t + 7000, 1000)  # step number already emitted
    g.step(5, t + 9000, 1000)
    a = StepAssembler(0)
    out = a.feed(g.records) + a.flush()
    assert [m.step for m in out] == [1, 2, 4, 5]
    assert a.bad["clock_jump"] == 1 and a.bad["step_out_of_order"] == 1
