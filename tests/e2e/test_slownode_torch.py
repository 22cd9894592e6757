"""FD-OL slow-node detection on a real PyTorch CPU training job (issues 5 "Real input" and 16).

clusterd and two noded processes run on loopback; the job (faultmesh.profiler.example_job: 4 gloo
ranks, TP groups [0,1] and [2,3] plus a global all-reduce, ~155 ms steps on an idle 2-core box) is
instrumented with faultmesh.profiler and honours the data-trace switch clusterd writes.
Ranks 0,1 are placed on node-a and 2,3 on node-b. The FeatConf is the documented defaults
(fdol.md §7) with 0.5 s rounds, rules ``faultmesh`` (communication profiling stays on).

The job runs with its TP collectives where Megatron has them, inside the forward range (a TP
all-reduce after every layer's forward and every layer's backward but the first; issue 16), so the
TP members show the same forward time and a slow rank shows only as the one that computes longer
between the per-operation barriers and arrives last (waits least) at them; its slowdown is
``--factor`` x each of those compute segments.

- Stall: from step 30 rank 2 sleeps 0.4 x each compute segment's wall time.
  clusterd must log ``got degradation, slow rank ids: [2]`` (and no other rank) within 3 rounds of
  the confirmation becoming possible (the 5th slow round that localizes the rank; one round in
  between without it is tolerated, ``confirmGapRounds``; a slow round naming a host or a domain
  also counts for the tracker, so an earlier confirmation is within the bound).
- Slow compute: the job with 2 ranks (one TP pair, both on node-a, one core each); from step 30
  rank 1 does +20 % compute in every segment (CPU work calibrated in thread CPU time): the same,
  only rank 1 named, found by the gap rule's long horizon (160 steps).
- Data-loader stall: from step 30 rank 1's data loader sleeps 0.4 x its compute time; the cluster
  result names rank 1, and only it, in ``slowIORanks``, and no slow compute rank is reported (its
  TP partner waits for it at the first barrier of the step only, which the wait rule skips).
- Clean: the same job without slowdown logs nothing and raises no fault.

The stall and slow-compute tests make the condition they need (issue 36): what the box gave is
measured while the job runs -- the slow rank's compute between its TP collectives (wall time, what
the gap rule judges) against its TP peer's, from the job's live per-step rows -- and the injected
factor is raised through the job's ``--factor-file`` (up to 4 x) until that ratio reaches 1 + 0.9 x
the nominal slowdown (x1.18 for +20 %: on a loaded box the same CPU work came out as x0.92-x1.17 of
the peer's), or more where the box's own per-operation noise would hide it (:class:`Slowdown`);
only a run that held it for 410 steps unnamed fails. A run that cannot reach it within 150 s, or
whose extra named rank the box itself slowed as much (:func:`box_made_stragglers`), is tried once
more and then skipped with the figures of both (``pytest -rs`` shows them). With the gap rule
disabled (its flagged cards emptied in fdol/slownode/node.py, then reverted) both fail with
"missed: the slowdown was achieved, not named" (load 8-9: stall x1.72 held 412 steps, compute
x1.56 held 413 steps, their gap scores 1.5-2.4).

Timing-sensitive: skipped on parallel runners (pytest-xdist), and when the job's own steps ran
slower than 270 ms (1.75 x the ~155 ms of the 4-rank job on an idle 2-core box: other work on the
box dominates its timing; ``FAULTMESH_TIMING_TESTS=force`` runs them anyway) --
../shared/reference/torch-real-input.md §6. No load-average gate any more (issue 36): the 1-minute
average lags (work that ended up to a minute before still counts) and says nothing of this run,
and the data-loader and clean tests passed at load 4.6-12.8 with it forced off (5 and 4 runs). The box's 4 ranks
share 2 cores: the scheduler keeps one member of a TP pair behind for tens of steps at times,
which is why the wait rule judges 40-step windows (fdol/slownode/peers.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "torch", reason="needs the faultmesh[torch] extra: pip install -e '.[torch]' (torch==2.13.0)"
)

from torchjob import (  # noqa: E402
    PAIR,
    TIMING_MARKS,
    featconf,
    http,
    judged_to,
    named_ranks,
    require_normal_steps,
    rounds_later,
    run_job,
    run_stack,
    skip_if_box_made,
    slowdown_named,
)

pytestmark = TIMING_MARKS


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from run_stack(tmp_path_factory)


@pytest.mark.timeout(600)
def test_stall_rank2_detected(stack):
    # rank 2 sleeps 0.4 x each compute segment: its gaps against its TP peer's (rank 3) reach
    # x1.36 at least (raised if the box's scheduling ate part of it); 4 ranks share the 2 cores
    slowdown_named(stack, "torch-stall", "sleep", "node-b", slow=2, peer=3, factor=0.4)


@pytest.mark.timeout(600)
def test_compute_rank1_plus20_detected(stack):
    # two ranks, one TP pair on node-a, each on its own core as each rank has its own NPU on a real
    # node: with the 4-rank job's 4 processes on 2 cores the scheduler's sharing hid the +20 %
    # (rank 2's gap excess 0.11-0.14 against a per-operation spread of 0.26-0.43); here the gap
    # rule's long horizon (gapLongWindowSteps, 160) names it: healthy members' 160-step excess
    # 0.019-0.035 against the slow rank's 0.08-0.15 in the recorded runs (fdol/slownode/peers.py).
    # The +20 % of CPU work reached x1.09-x1.19 of the peer's compute on the box (issue 36): the
    # factor is raised until rank 1's gaps are x1.18 its peer's.
    slowdown_named(
        stack, "torch-compute", "compute", "node-a", slow=1, peer=0, factor=0.2, ranks=2, placement=PAIR
    )


def test_dataloader_stall_rank1_named(stack):
    tmp, cd, prof, dt = stack
    job = "torch-loader"
    http(cd.http, "POST", "/v1/slownode/jobs", featconf(job))
    named: list[list[int]] = []

    def io_named() -> bool:
        st = http(cd.http, "GET", f"/v1/slownode/{job}")
        io = (st.get("cluster") or {}).get("slowIORanks") or []
        if io:
            named.append(io)
        return len(named) >= 5 and rounds_later(cd, job)  # and see that nothing else gets reported

    summ = run_job(tmp, prof, dt, job, "dataloader", 300, stop_when=io_named, slow_rank=1)
    require_normal_steps(summ[0]["rows"])
    assert named and all(io == [1] for io in named), named
    hist = http(cd.http, "GET", f"/v1/slownode/{job}")["history"]
    skip_if_box_made(summ, named_ranks(cd, job) | {r for h in hist for r in h["slowCalculateRanks"]})
    assert not named_ranks(cd, job)  # no slow compute rank
    assert not [h["round"] for h in hist if h["slowCalculateRanks"]], hist
    http(cd.http, "POST", f"/v1/slownode/{job}/disable", {})


def test_clean_run_logs_nothing(stack):
    tmp, cd, prof, dt = stack
    job = "torch-clean"
    http(cd.http, "POST", "/v1/slownode/jobs", featconf(job))
    summ = run_job(tmp, prof, dt, job, "none", 150)
    require_normal_steps(summ[0]["rows"])
    assert all(len(s["rows"]) == 150 for s in summ.values())
    judged_to(cd, job, 150 - 2)  # the last step whose records noded judges (the 149th: none after it)
    status = http(cd.http, "GET", f"/v1/slownode/{job}")
    assert status["rounds"] >= 5, status
    skip_if_box_made(summ, named_ranks(cd, job))
    assert not named_ranks(cd, job)
    assert not status["degraded"]
    assert not [f for f in cd.get_json("/v1/faults") if f["attributes"].get("jobId") == job]
    assert all(s["dropped_records"] == 0 for s in summ.values())
