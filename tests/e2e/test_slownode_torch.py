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
  only rank 1 named, found by the gap rule's long horizon (160 steps). Asserted on the achieved
  CPU ratio.
- Data-loader stall: from step 30 rank 1's data loader sleeps 0.4 x its compute time; the cluster
  result names rank 1, and only it, in ``slowIORanks``, and no slow compute rank is reported (its
  TP partner waits for it at the first barrier of the step only, which the wait rule skips).
- Clean: the same job without slowdown logs nothing and raises no fault.

Timing-sensitive: skipped on parallel runners (pytest-xdist) and on an overloaded box (load average
> 2.5 per CPU, or clean steps > 270 ms: 1.75 x the ~155 ms of an idle box, the margin the 87 ms /
150 ms limit had before the per-layer all-reduces) — ../shared/reference/torch-real-input.md §6;
``FAULTMESH_TIMING_TESTS=force`` runs it anyway. The box's 4 ranks share 2 cores: the scheduler keeps
one member of a TP pair behind for tens of steps at times, which is why the wait rule judges 40-step
windows (fdol/slownode/peers.py).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip(
    "torch", reason="needs the faultmesh[torch] extra: pip install -e '.[torch]' (torch==2.13.0)"
)

from support import ClusterdProcess, free_port, wait_http  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.serial,  # `make test` runs it alone after the parallel part
    pytest.mark.skipif(
        bool(os.environ.get("PYTEST_XDIST_WORKER")),
        reason="timing test: must not share the 2 cores with parallel test workers",
    ),
    pytest.mark.timeout(420),
]

PHRASE = re.compile(
    r"\[FD-OL SLOWNODE\]job\(name=(\S+), namespace=default, jobId=\S+\) in cluster got degradation, "
    r"slow rank ids: \[([0-9 ]*)\]"
)
PLACEMENT = {"0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}
PAIR = {"0": "node-a", "1": "node-a"}  # the 2-rank job: one TP pair
SLOW_FROM = 30


def _featconf(job: str, ranks: dict[str, str] = PLACEMENT) -> dict:
    # Documented defaults (fdol.md §7) except the round period: 0.5 s rounds for a ~155 ms-step job.
    return {
        "jobName": job,
        "jobNamespace": "default",
        "normalNumber": 20,
        "nSigma": 3,
        "degradationPercentage": 0.3,
        "nConsecAnomaliesSignifySlow": 3,
        "nSecondsDoOneDetection": 0.5,
        "clusterMeanDistance": 1.3,
        "cardOneNode": 16,
        "SlowNode": 1,
        "ranks": ranks,
    }


def _http(base: str, method: str, path: str, body=None):
    req = urllib.request.Request(
        f"http://{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


class _Noded:
    def __init__(self, tmp: Path, node: str, grpc: str, prof: Path) -> None:
        self.http = f"127.0.0.1:{free_port()}"
        self.log = tmp / f"noded-{node}.log"
        self.cmd = [
            sys.executable,
            "-m",
            "noded",
            "--node-name",
            node,
            "--clusterd",
            grpc,
            "--http-addr",
            self.http,
            "--profiling-dir",
            str(prof),
            "--min-report-interval",
            "0.1",
        ]

    def start(self) -> _Noded:
        self._fh = open(self.log, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._fh, stderr=subprocess.STDOUT)
        wait_http(f"http://{self.http}/healthz")
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._fh.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch-e2e")
    prof, dt = tmp / "profiling", tmp / "datatrace"
    prof.mkdir()
    dt.mkdir()
    cd = ClusterdProcess(tmp / "state", ["--data-trace-dir", str(dt)], log_path=tmp / "clusterd.log").start()
    nodes = [_Noded(tmp, n, cd.grpc, prof).start() for n in ("node-a", "node-b")]
    try:
        yield tmp, cd, prof, dt
    finally:
        for n in nodes:
            n.stop()
        cd.stop()


def _run_job(
    tmp: Path,
    prof: Path,
    dt: Path,
    job: str,
    mode: str,
    steps: int,
    stop_when=None,
    slow_rank: int = 2,
    factor: float = 0.4,
    ranks: int = 4,
) -> dict[int, dict]:
    summary = tmp / f"summary-{job}"
    stop_file = tmp / f"stop-{job}"
    cmd = [
        sys.executable,
        "-m",
        "faultmesh.profiler.example_job",
        "--base-dir",
        str(prof),
        "--task-id",
        job,
        "--switch",
        str(dt / f"default.data-trace-{job}" / "profilingSwitch"),
        "--steps",
        str(steps),
        "--slow-mode",
        mode,
        "--slow-rank",
        str(slow_rank),
        "--slow-from",
        str(SLOW_FROM),
        "--factor",
        str(factor),
        "--flush-s",
        "0.5",
        "--switch-poll-s",
        "0.5",
        "--stop-file",
        str(stop_file),
        "--summary",
        str(summary),
        "--ranks",
        str(ranks),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    with open(tmp / f"job-{job}.log", "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 360
            while proc.poll() is None:
                if stop_when is not None and not stop_file.exists() and stop_when():
                    time.sleep(1.0)  # a few more rounds to see nothing else gets reported
                    stop_file.touch()
                if time.monotonic() > deadline:
                    raise AssertionError("the torch job did not finish in 360 s")
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, (tmp / f"job-{job}.log").read_text()[-3000:]
    return {r: json.loads((summary / f"rank{r}.json").read_text()) for r in range(ranks)}


def _require_quiet_box() -> None:
    """Skip when other work saturates the machine: the test measures timing (torch-real-input.md §6)."""
    if os.environ.get("FAULTMESH_TIMING_TESTS") == "force":
        return
    load = os.getloadavg()[0]
    if load > 2.5 * (os.cpu_count() or 1):
        pytest.skip(
            f"box overloaded (load average {load:.1f} on {os.cpu_count()} CPUs): timing test not meaningful"
        )


QUIET_STEP_MS = 155  # median step of the job on an idle 2-core box (per-layer TP all-reduces)
MAX_STEP_MS = 270  # 1.75 x: above, other work on the box dominates the job's timing


def _require_normal_steps(rows) -> None:
    """Skip when the job's steps were far slower than on a quiet box (the whole run: a load that
    comes after the slowdown starts distorts it as much as one before)."""
    med = statistics.median(r["period"] for r in rows)
    if med > MAX_STEP_MS and os.environ.get("FAULTMESH_TIMING_TESTS") != "force":
        pytest.skip(
            f"box overloaded during the run: median step {med:.0f} ms (quiet box: ~{QUIET_STEP_MS} ms)"
        )


def _median(rows, key, lo, hi):
    return statistics.median(r[key] for r in rows if lo <= r["step_no"] < hi)


def _assert_named_alone(cd, job: str, rank: int, node: str) -> None:
    """clusterd reported ``rank`` and only it, within 3 rounds of the confirmation becoming
    possible, and raised one 110001010 on ``node``."""
    found = [m for m in PHRASE.findall(cd.log_text()) if m[0] == job]
    assert found == [(job, str(rank))], found
    status = _http(cd.http, "GET", f"/v1/slownode/{job}")
    assert status["degraded"] and status["slowRanks"] == [rank]
    hist = status["history"]
    confirm = next(i for i, h in enumerate(hist) if h["degraded"])
    # confirmation becomes possible at the 5th round that localizes the rank (one round without it
    # is tolerated, a second restarts the count); it must follow within 3 rounds of that. Slow rounds
    # that name something else (a host, a domain) also count for the tracker, so it may confirm
    # before the 5th localizing round: earlier is within the bound.
    run, gaps, possible = 0, 0, None
    for i, h in enumerate(hist[: confirm + 1]):
        if rank in h["slowCalculateRanks"]:
            run += 1
        elif run and gaps < 1:
            gaps += 1
        else:
            run, gaps = 0, 0
        if run >= 5:
            possible = i
            break
    rounds = [(h["round"], h["slowCalculateRanks"], h["isSlow"]) for h in hist[: confirm + 4]]
    assert possible is None or confirm - possible <= 3, rounds
    assert any(rank in h["slowCalculateRanks"] for h in hist[: confirm + 1]), rounds
    others = [h["round"] for h in hist if set(h["slowCalculateRanks"]) - {rank}]
    print(f"rounds that also localized another rank (never reported): {others}; confirmed at round {confirm}")
    faults = [
        f
        for f in cd.get_json("/v1/faults")
        if f["source"] == "fd-online" and f["attributes"].get("jobId") == job
    ]
    assert [(f["node"], f["code"], f["attributes"]["influence"]) for f in faults] == [
        (node, "110001010", str(rank))
    ]


def test_stall_rank2_detected(stack):
    tmp, cd, prof, dt = stack
    _require_quiet_box()
    job = "torch-stall"
    _http(cd.http, "POST", "/v1/slownode/jobs", _featconf(job))
    summ = _run_job(
        tmp,
        prof,
        dt,
        job,
        "sleep",
        400,
        stop_when=lambda: any(m[0] == job for m in PHRASE.findall(cd.log_text())),
    )
    rows = {r: s["rows"] for r, s in summ.items()}
    _require_normal_steps(rows[0])
    last = min(len(v) for v in rows.values())

    # What the stall did, for the record (no precondition: with the TP all-reduce inside the forward
    # range and 4 ranks on 2 cores, neither the step time nor rank 2's compute phase rises reliably --
    # while rank 2 sleeps the others get its core, and it then waits least at each TP collective).
    step_rise = _median(rows[0], "period", SLOW_FROM, last) / _median(rows[0], "period", 0, SLOW_FROM)
    print(f"stall: step time x{step_rise:.2f}, steps run {last}")
    _assert_named_alone(cd, job, 2, "node-b")
    _http(cd.http, "POST", f"/v1/slownode/{job}/disable", {})


def test_compute_rank1_plus20_detected(stack):
    # two ranks, one TP pair on node-a, each on its own core as each rank has its own NPU on a real
    # node: with the 4-rank job's 4 processes on 2 cores the scheduler's sharing hid the +20 %
    # (rank 2's gap excess 0.11-0.14 against a per-operation spread of 0.26-0.43); here the gap
    # rule's long horizon (gapLongWindowSteps, 160) names it: healthy members' 160-step excess
    # 0.019-0.035 against the slow rank's 0.08-0.15 in the recorded runs (fdol/slownode/peers.py)
    tmp, cd, prof, dt = stack
    _require_quiet_box()
    job = "torch-compute"
    _http(cd.http, "POST", "/v1/slownode/jobs", _featconf(job, PAIR))
    summ = _run_job(
        tmp,
        prof,
        dt,
        job,
        "compute",
        500,
        stop_when=lambda: any(m[0] == job for m in PHRASE.findall(cd.log_text())),
        slow_rank=1,
        factor=0.2,
        ranks=2,
    )
    rows = {r: s["rows"] for r, s in summ.items()}
    _require_normal_steps(rows[0])
    last = min(len(v) for v in rows.values())
    # What was achieved: rank 1's compute CPU against rank 0's, after vs before.
    after = {r: _median(rows[r], "compute_cpu", SLOW_FROM, last) for r in range(2)}
    before = {r: _median(rows[r], "compute_cpu", 0, SLOW_FROM) for r in range(2)}
    step_rise = _median(rows[0], "period", SLOW_FROM, last) / _median(rows[0], "period", 0, SLOW_FROM)
    print(
        f"achieved: rank-1 compute CPU ratio {before[1] / before[0]:.2f} -> {after[1] / after[0]:.2f}, "
        f"step time x{step_rise:.2f}, steps run {last}"
    )
    assert after[1] / after[0] > 1.1, "the slowdown was not achieved; box overloaded?"
    _assert_named_alone(cd, job, 1, "node-a")
    _http(cd.http, "POST", f"/v1/slownode/{job}/disable", {})


def test_dataloader_stall_rank1_named(stack):
    tmp, cd, prof, dt = stack
    _require_quiet_box()
    job = "torch-loader"
    _http(cd.http, "POST", "/v1/slownode/jobs", _featconf(job))
    named: list[list[int]] = []

    def io_named() -> bool:
        st = _http(cd.http, "GET", f"/v1/slownode/{job}")
        io = (st.get("cluster") or {}).get("slowIORanks") or []
        if io:
            named.append(io)
        return len(named) >= 5

    summ = _run_job(tmp, prof, dt, job, "dataloader", 300, stop_when=io_named, slow_rank=1)
    _require_normal_steps(summ[0]["rows"])
    assert named and all(io == [1] for io in named), named
    assert not [m for m in PHRASE.findall(cd.log_text()) if m[0] == job]  # no slow compute rank
    hist = _http(cd.http, "GET", f"/v1/slownode/{job}")["history"]
    assert not [h["round"] for h in hist if h["slowCalculateRanks"]], hist
    _http(cd.http, "POST", f"/v1/slownode/{job}/disable", {})


def test_clean_run_logs_nothing(stack):
    tmp, cd, prof, dt = stack
    _require_quiet_box()
    job = "torch-clean"
    _http(cd.http, "POST", "/v1/slownode/jobs", _featconf(job))
    summ = _run_job(tmp, prof, dt, job, "none", 150)
    _require_normal_steps(summ[0]["rows"])
    assert all(len(s["rows"]) == 150 for s in summ.values())
    time.sleep(1.5)  # the last rounds
    status = _http(cd.http, "GET", f"/v1/slownode/{job}")
    assert status["rounds"] >= 5, status
    assert not [m for m in PHRASE.findall(cd.log_text()) if m[0] == job]
    assert not status["degraded"]
    assert not [f for f in cd.get_json("/v1/faults") if f["attributes"].get("jobId") == job]
    assert all(s["dropped_records"] == 0 for s in summ.values())
