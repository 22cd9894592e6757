"""FD-OL slow-node detection on a real data-parallel-only PyTorch job (issue 34).

The example job with ``--parallel ddp``: 2 gloo ranks (both on node-a, one core each, as each rank
has its own NPU on a real node), ``torch.nn.parallel.DistributedDataParallel`` over a ``dp`` group
with 0.25 MB gradient buckets (4 buckets a step), no TP group. Each bucket's all-reduce is launched
asynchronously as soon as the backward filled it and recorded by the profiler's DDP comm hook
(:func:`faultmesh.profiler.torch.record_ddp_buckets`) from launch to completion; the parse stage
turns them into ``dp_starts`` / ``dp_ops`` / ``dp_gaps`` and noded's arrival-lag rule
(fdol/slownode/dp.py, ``dpArrivalLag``) judges who arrives late at them. clusterd and two noded
processes run on loopback with the documented FeatConf defaults and 0.5 s rounds (as in
tests/e2e/test_slownode_torch.py, whose helpers live in tests/torchjob.py).

- Slow compute: from step 30 rank 1 does +20 % compute before every bucket's launch (CPU work
  calibrated in thread CPU time): clusterd must log ``got degradation, slow rank ids: [1]`` and
  no other rank, with one 110001010 on node-a. The condition is made (issue 36): rank 1's compute
  up to its last bucket against rank 0's is measured while the job runs and the factor raised (up
  to 4 x) until it reaches x1.18, or more where the box's noise in the arrivals demands it; only a
  run that held it for 410 steps unnamed fails, one that cannot reach it is retried once and then
  skipped with the figures.
- Clean: the same job without slowdown names nobody and raises no fault.

The box's two ranks share its 2 cores (and other suites' work): the rule finds the group on a
shared host from its step jitter and judges it on its 160-step long horizon only
(fdol/slownode/dp.py, "Shared hosts"), so a rank is named 160 steps and 5 rounds after the job
began at the earliest. Before that guard, 19 recorded clean runs replayed with these settings
named a healthy rank in every one (x2 bursts of 5-25 steps); after it, none (highest score 0.63).
Recorded with it (2-core box, helpers' tests beside): 4 runs in a row, the slowed rank named alone
in 4 (at steps ~187-534 of the slow run, the factor raised to 20-80 %), the clean run passed in 4.
Earlier, with the data-parallel rule disabled (its flagged cards emptied in
fdol/slownode/node.py, then reverted) the slow test failed "missed: the slowdown was achieved,
not named" (x1.37 held 1005 steps): no other rule sees a DDP-only job's slow rank.

Timing-sensitive (marked serial, skipped on parallel runners), as the TP tests.
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
    run_job,
    run_stack,
    skip_if_box_made,
    slowdown_named,
)

pytestmark = TIMING_MARKS

DDP = ["--parallel", "ddp"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    yield from run_stack(tmp_path_factory)


@pytest.mark.timeout(600)
def test_ddp_compute_rank1_plus20_named(stack):
    slowdown_named(
        stack, "ddp-compute", "compute", "node-a", slow=1, peer=0, factor=0.2,
        ranks=2, placement=PAIR, args=DDP, score="dpLag", cumulative=True,
    )  # fmt: skip


STEPS = 600  # ~25 s: 12 rounds


def test_ddp_clean_run_names_nobody(stack):
    tmp, cd, prof, dt = stack
    job = "ddp-clean"
    http(cd.http, "POST", "/v1/slownode/jobs", featconf(job, PAIR))
    summ = run_job(tmp, prof, dt, job, "none", STEPS, ranks=2, args=DDP)
    require_normal_steps(summ[0]["rows"])
    assert all(len(s["rows"]) == STEPS for s in summ.values())
    judged_to(cd, job, STEPS - 2, nodes=1)  # the last step whose records noded judges
    status = http(cd.http, "GET", f"/v1/slownode/{job}")
    assert status["rounds"] >= 5, status
    lag = status["nodeResults"]["node-a"].get("dpLag") or {}
    assert set(lag) == {"0", "1"}, status["nodeResults"]  # the rule judged both ranks
    skip_if_box_made(summ, named_ranks(cd, job))
    assert not named_ranks(cd, job)
    assert not status["degraded"]
    assert not [f for f in cd.get_json("/v1/faults") if f["attributes"].get("jobId") == job]
    assert all(s["dropped_records"] == 0 for s in summ.values())
