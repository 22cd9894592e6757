"""Slow-node detection on real PyTorch CPU jobs: clean, stall, +20 % compute and data-loader stall
(needs faultmesh[torch]), faultmesh's rules beside the reference's, and the real records beside the
simulator's (bench/trainsim_tp.py SHARED_BOX).

Each run is ``faultmesh.profiler.example_job`` (4 gloo ranks, TP groups [0,1] and [2,3] with a TP
all-reduce after every layer's forward and backward inside the forward range, as Megatron, plus a
global all-reduce; profiling always on; ``--job-args`` passes more of its flags), replayed offline through the node level (node-a: ranks 0,1; node-b: ranks 2,3), the cluster
merge and the confirmation state machine with rounds every ``--round-s`` seconds of job time (the
steps per round follow the measured step time). Cases (from step 30):

- clean: no slowdown;
- stall: rank 2 sleeps 0.4 x each compute segment's wall time (between its TP collectives);
- compute: rank 2 runs +20 % CPU work in each segment (calibrated in thread CPU time);
- loader: rank 1's data loader sleeps 0.4 x its compute time.

Per case: detected (confirmed slow ranks == [2]; loader: the confirmation names rank 1 in
``slowIORanks`` and no slow rank), false alarms (any other naming), detection delay (steps after
step 30), the achieved slowdown (rank-2 compute CPU / others, step-time rise), for both rule sets.
``--records`` also prints, per case, the real records' per-rank distributions (forward, TP wait,
step, data loader: p10/p50/p90 ms) and the wait-asymmetry z range of healthy and slow ranks over
40-step windows beside the same from the simulator's shared-box model.
Default: 1 run per case (about 3 min on an idle 2-core box); the issue's full run is ``--runs 5``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fdol.slownode.featconf import parse_featconf
from fdol.slownode.replay import replay

SLOW_FROM = 30
PLACEMENT = {"node-a": [0, 1], "node-b": [2, 3]}


CASES = {  # case -> (slow mode, slow rank, factor)
    "clean": ("none", 2, 0.2),
    "stall": ("sleep", 2, 0.4),
    "compute": ("compute", 2, 0.2),
    "loader": ("dataloader", 1, 0.4),
}


def run_job(
    tmp: Path, name: str, mode: str, steps: int, rank: int = 2, factor: float = 0.4, extra: tuple = ()
) -> dict[int, dict]:
    """Run the example job (``extra``: more of its flags); per-rank summaries."""
    cmd = [
        sys.executable,
        "-m",
        "faultmesh.profiler.example_job",
        "--base-dir",
        str(tmp / "prof"),
        "--task-id",
        name,
        "--steps",
        str(steps),
        "--slow-mode",
        mode,
        "--slow-rank",
        str(rank),
        "--slow-from",
        str(SLOW_FROM),
        "--factor",
        str(factor),
        "--flush-s",
        "1",
        "--summary",
        str(tmp / name),
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    subprocess.run(
        cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600
    )
    return {r: json.loads((tmp / name / f"rank{r}.json").read_text()) for r in range(4)}


def evaluate(tmp: Path, name: str, summ: dict, round_s: float, rules: str) -> tuple[str, int | None]:
    """Replay the recorded job; -> (detected | false_alarm | missed | quiet, delay in steps)."""
    case = name.split("-")[0]
    period = statistics.median(r["period"] for r in summ[0]["rows"])
    per_round = max(1, round(round_s * 1000 / period))
    conf = parse_featconf({"jobName": name, "nSecondsDoOneDetection": round_s, "rules": rules})
    _, rank, _ = CASES[case]
    for lg in replay(tmp / "prof" / name, PLACEMENT, conf, per_round):
        for kind, ranks in lg.actions:
            io = (lg.cluster or {}).get("slowIORanks") or []
            if kind == "report" and ranks:
                if case in ("stall", "compute") and ranks == [rank] and lg.step >= SLOW_FROM:
                    return "detected", lg.step - SLOW_FROM
                return "false_alarm", None
            if kind == "confirm" and not ranks and io:
                if case == "loader" and io == [rank] and lg.step >= SLOW_FROM:
                    return "detected", lg.step - SLOW_FROM
                return "false_alarm", None
    return ("quiet" if case == "clean" else "missed"), None


def achieved(summ: dict, rank: int) -> tuple[float, float]:
    """(slow rank's compute CPU / the others' after step 30, rank 0's step-time rise)."""
    rows = {r: s["rows"] for r, s in summ.items()}

    def med(r, key, lo, hi):
        return statistics.median(x[key] for x in rows[r] if lo <= x["step_no"] < hi)

    last = min(len(v) for v in rows.values())
    after = {r: med(r, "compute_cpu", SLOW_FROM, last) for r in range(4)}
    ratio = after[rank] / statistics.median(after[r] for r in range(4) if r != rank)
    rise = med(0, "period", SLOW_FROM, last) / med(0, "period", 0, SLOW_FROM)
    return ratio, rise


def _q(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    return "/".join(f"{xs[min(len(xs) - 1, int(p * len(xs)))]:.0f}" for p in (0.1, 0.5, 0.9))


def wait_z(steps: dict, slow: int | None, window: int = 40) -> tuple[float, float | None]:
    """(max z of healthy ranks, median z of the slow rank in windows wholly after onset): the
    wait-asymmetry sign test of fdol/slownode/peers.py over sliding ``window``-step windows."""
    from fdol.slownode.peers import aligned_ops, last_arrivals

    healthy, bad = [], []
    n = min(len(v) for v in steps.values())
    for g in ([0, 1], [2, 3]):
        for end in range(window + 5, n, 3):
            counts, total = last_arrivals(aligned_ops(g, {r: steps[r][:end] for r in g}, window), 0.2)
            if not total:
                continue
            for r in g:
                z = (counts[r] - total / 2) / (total / 4) ** 0.5
                if r == slow:
                    if end - window >= SLOW_FROM:
                        bad.append(z)
                elif slow not in g or end <= SLOW_FROM:
                    healthy.append(z)
    return max(healthy, default=0.0), statistics.median(bad) if bad else None


def records_line(label: str, steps: dict, slow: int | None) -> str:
    """Per-rank-pooled p10/p50/p90 (ms) of forward, TP wait (median per step), step and data
    loader before step 30, and the wait-asymmetry z (see :func:`wait_z`)."""

    def pool(col):
        return [getattr(m, col) / 1e6 for v in steps.values() for m in v if m.step < SLOW_FROM]

    hz, sz = wait_z(steps, slow)
    return (
        f"  {label:5} forward {_q(pool('compute')):>11} | TP wait {_q(pool('zp_med')):>8} | step "
        f"{_q(pool('step_time')):>11} | loader {_q(pool('dataloader_host')):>8} | z healthy max "
        f"{hz:.1f}" + (f", slow median {sz:.1f}" if sz is not None else "")
    )


def sim_steps(case: str, seed: int) -> dict:
    """The same case on the simulator's shared-box model, read back through the reader."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trainsim_tp import SHARED_BOX, Fault, Sim, SimConf, shared_box_layout

    from fdol.slownode.replay import load_steps

    mode, rank, factor = CASES[case]
    fault = {
        "clean": Fault(),
        "stall": Fault("card", rank, 1 + factor, onset=SLOW_FROM),
        "compute": Fault("card", rank, 1 + factor, onset=SLOW_FROM),
        "loader": Fault("dataloader", rank, onset=SLOW_FROM, add_ms=45.0),
    }[case]
    sim = Sim(shared_box_layout(), SimConf(**{**SHARED_BOX, "seed": seed}), fault)
    with tempfile.TemporaryDirectory() as d:
        sim.write_groups(Path(d))
        sim.write_steps(Path(d), 150)
        steps, _ = load_steps(d, [0, 1, 2, 3])
    return steps


def profiler_cost_us() -> float:
    """µs the profiler spends per step of the example job's shape (step, dataloader, forward, 7 TP
    collectives of 16384 elements inside it, the gradient's TP and DP all-reduces)."""
    from faultmesh.profiler import Profiler

    with tempfile.TemporaryDirectory() as d:
        p = Profiler(0, base_dir=d, task_id="cost", flush_interval_s=5.0)
        n = 2000
        t0 = time.perf_counter()
        for s in range(n):
            with p.step(s):
                with p.dataloader():
                    pass
                with p.forward():
                    for _ in range(7):
                        with p.comm("AllReduce", "tp", 16384, "float32"):
                            pass
                for g in ("tp", "0"):
                    with p.comm("AllReduce", g, 265738, "float32"):
                        pass
        p.close()
        return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs per case (the issue's full run: 5)")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--records", action="store_true", help="also compare the records with the simulator's")
    ap.add_argument("--round-s", type=float, default=0.5)
    ap.add_argument("--job-args", default="", help="more flags of the job, e.g. '--layers 2 --batch 4096'")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("needs the faultmesh[torch] extra (torch==2.13.0); nothing measured")
        return 2
    t_start = time.perf_counter()
    cost = profiler_cost_us()
    results: dict[tuple[str, str], list] = {}
    periods = []
    from fdol.slownode.replay import load_steps

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print(
            f"{'case':8} {'run':>3} {'faultmesh':12} {'delay':>5} {'reference':12} {'delay':>5} "
            f"{'cpu x':>6} {'step x':>6} {'step ms':>7}"
        )
        for case, (mode, rank, factor) in CASES.items():
            for i in range(args.runs):
                name = f"{case}-{i}"
                summ = run_job(tmp, name, mode, args.steps, rank, factor, tuple(args.job_args.split()))
                period = statistics.median(r["period"] for r in summ[0]["rows"])
                periods.append(period)
                cells = []
                for rules in ("faultmesh", "reference"):
                    out, delay = evaluate(tmp, name, summ, args.round_s, rules)
                    results.setdefault((case, rules), []).append((out, delay))
                    cells.append(f"{out:12} {'' if delay is None else delay:>5}")
                ratio, rise = achieved(summ, rank)
                print(f"{case:8} {i:>3} {' '.join(cells)} {ratio:>6.2f} {rise:>6.2f} {period:>7.0f}")
                if args.records:
                    steps, _ = load_steps(tmp / "prof" / name, [0, 1, 2, 3])
                    slow = None if case in ("clean", "loader") else rank
                    print(records_line("real", steps, slow))
                    print(records_line("sim", sim_steps(case, i), slow))
    step_ms = statistics.median(periods)
    summary = []
    for (case, rules), rs in results.items():
        det = sum(o == "detected" for o, _ in rs)
        fa = sum(o == "false_alarm" for o, _ in rs)
        delays = [dl for o, dl in rs if o == "detected"]
        d = f"{statistics.mean(delays):.0f}" if delays else "-"
        print(f"{case} ({rules}): detected {det}/{len(rs)}, false alarms {fa}, mean delay {d} steps")
        summary.append(f"{case}/{rules[:3]} det {det}/{len(rs)} fa {fa} delay {d}")
    print(
        f"summary: {'; '.join(summary)}; profiler {cost:.0f} us/step = {100 * cost / 1000 / step_ms:.3f} % of "
        f"a {step_ms:.0f} ms step; wall {time.perf_counter() - t_start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
