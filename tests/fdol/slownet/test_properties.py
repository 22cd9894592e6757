"""Property tests: ping-list coverage on arbitrary super pods, window verdicts against a direct
computation of the threshold rule."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fdol.slownet import pinglist, topology
from fdol.slownet.window import PathWindow, PingRow


@st.composite
def super_pods(draw):
    n_nodes = draw(st.integers(1, 60))
    nodes = {}
    for i in range(n_nodes):
        phys = draw(st.sets(st.integers(0, 15), min_size=1, max_size=16))
        server = i + 1
        nodes[f"n{i}"] = topology.NodeTopology(
            f"n{i}", server, {p: topology.make_sdid(server, p) for p in phys}
        )
    return topology.SuperPod("0", nodes)


@settings(max_examples=25, deadline=None)
@given(super_pods(), st.sampled_from(["mesh", "ring"]))
def test_every_npu_and_every_node_pair_is_probed(sp, intra):
    pairs = pinglist.generate(sp, intra=intra)
    npus = {(n.name, p) for n in sp.nodes.values() for p in n.devices}
    multi = {
        (n.name, p) for n in sp.nodes.values() for p in n.devices if len(n.devices) > 1 or len(sp.nodes) > 1
    }
    assert {(p.dst_node, p.dst_phy) for p in pairs} == multi
    assert {(p.src_node, p.src_phy) for p in pairs} <= npus
    probed = {(p.src_node, p.dst_node) for p in pairs if p.src_node != p.dst_node}
    n = len(sp.nodes)
    for a, b in itertools.permutations(sp.nodes, 2):
        if n - 1 <= pinglist.MAX_DESTS * len(sp.nodes[a].devices):  # the documented coverage bound
            assert (a, b) in probed
    per_task: dict = {}
    for p in pairs:
        per_task[(p.src_sdid, p.task_id)] = per_task.get((p.src_sdid, p.task_id), 0) + 1
        assert p.src_sdid != p.dst_sdid
    assert not per_task or max(per_task.values()) <= pinglist.MAX_DESTS


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=8, max_size=8),
    st.floats(0, 1),
    st.lists(st.floats(0, 500), min_size=8, max_size=8),
    st.floats(0, 500),
)
def test_verdict_equals_mean_plus_three_std_rule(base_loss, loss, base_delay, delay):
    w = PathWindow(10_000, loss_abs_pct=None)
    rows = [
        PingRow(0, "0", "1", "0", "2", d, d, d, lr, k * 10_000 + 1)
        for k, (lr, d) in enumerate(zip(base_loss, base_delay, strict=True))
    ]
    rows.append(PingRow(0, "0", "1", "0", "2", delay, delay, delay, loss, 8 * 10_000 + 1))
    w.add(rows)
    r = w.evaluate(8)
    bl = np.array(base_loss) * 100
    thr = bl.mean() + 3 * max(bl.std(), 1.0)
    assert math.isclose(r.loss_thr[0], thr, rel_tol=1e-9, abs_tol=1e-9)
    assert bool(r.loss_fault[0]) == (loss * 100 >= r.loss_thr[0])
    bd = np.array(base_delay)
    dthr = bd.mean() + 3 * max(bd.std(), 1.0)
    assert math.isclose(r.delay_thr[0], dthr, rel_tol=1e-9, abs_tol=1e-9)
    assert bool(r.delay_fault[0]) == (delay >= r.delay_thr[0])
