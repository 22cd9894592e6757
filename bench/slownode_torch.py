"""Slow-node detection on real PyTorch CPU jobs: clean, stall and compute cases (needs faultmesh[torch]).

Each run is ``faultmesh.profiler.example_job`` (4 gloo ranks, TP groups [0,1] and [2,3] plus a global
all-reduce, profiling always on), replayed offline through the node level (node-a: ranks 0,1; node-b:
ranks 2,3), the cluster merge and the confirmation state machine with rounds every
``--round-s`` seconds of job time (the steps per round follow the measured step time). Cases:

- clean: no slowdown;
- stall: rank 2 sleeps 0.4 x its compute time per step from step 30;
- compute: rank 2 runs about 40 % more CPU work per step from step 30 (calibrated in thread CPU time).

Per case: detections (confirmed slow ranks == [2]), false alarms (any other confirmation),
detection delay (steps after step 30), the achieved slowdown (rank-2 compute / others, step-time rise)
and what the reference rules alone (pattern detector off) detect. Also the profiler's cost per step.
Default: 1 run per case (about 40 s on an idle 2-core box); the issue's full run is ``--runs 5``.
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


def run_job(tmp: Path, name: str, mode: str, steps: int) -> dict[int, dict]:
    """Run the example job; per-rank summaries."""
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
        "2",
        "--slow-from",
        str(SLOW_FROM),
        "--factor",
        "0.4",
        "--flush-s",
        "1",
        "--summary",
        str(tmp / name),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    subprocess.run(
        cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600
    )
    return {r: json.loads((tmp / name / f"rank{r}.json").read_text()) for r in range(4)}


def evaluate(tmp: Path, name: str, summ: dict, round_s: float, pattern: bool) -> tuple[str, int | None]:
    """Replay the recorded job; -> (detected | false_alarm | missed | quiet, delay in steps)."""
    period = statistics.median(r["period"] for r in summ[0]["rows"])
    per_round = max(1, round(round_s * 1000 / period))
    conf = parse_featconf({"jobName": name, "nSecondsDoOneDetection": round_s, "patternDetector": pattern})
    for lg in replay(tmp / "prof" / name, PLACEMENT, conf, per_round):
        for kind, ranks in lg.actions:
            if kind in ("report", "confirm") and ranks:
                if ranks == [2] and lg.step >= SLOW_FROM and name.split("-")[0] != "clean":
                    return "detected", lg.step - SLOW_FROM
                return "false_alarm", None
    return ("quiet" if name.startswith("clean") else "missed"), None


def achieved(summ: dict) -> tuple[float, float]:
    rows = {r: s["rows"] for r, s in summ.items()}

    def med(r, key, lo, hi):
        return statistics.median(x[key] for x in rows[r] if lo <= x["step_no"] < hi)

    last = min(len(v) for v in rows.values())
    after = {r: med(r, "compute", SLOW_FROM, last) for r in range(4)}
    ratio = after[2] / statistics.median(after[r] for r in (0, 1, 3))
    rise = med(0, "period", SLOW_FROM, last) / med(0, "period", 0, SLOW_FROM)
    return ratio, rise


def profiler_cost_us() -> float:
    """µs the profiler spends per step of the example job's shape (step, dataloader, forward, 2 collectives)."""
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
                    pass
                for g in ("tp", "0"):
                    with p.comm("AllReduce", g, 265738, "float32"):
                        pass
        p.close()
        return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs per case (the issue's full run: 5)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--round-s", type=float, default=0.5)
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("needs the faultmesh[torch] extra (torch==2.13.0); nothing measured")
        return 2
    t_start = time.perf_counter()
    cost = profiler_cost_us()
    results = {}
    periods = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print(
            f"{'case':8} {'run':>3} {'outcome':12} {'delay':>5} {'ref-only':12} {'compute x':>9} {'step x':>6}"
        )
        for case, mode in (("clean", "none"), ("stall", "sleep"), ("compute", "compute")):
            for i in range(args.runs):
                name = f"{case}-{i}"
                summ = run_job(tmp, name, mode, args.steps)
                periods.append(statistics.median(r["period"] for r in summ[0]["rows"]))
                out, delay = evaluate(tmp, name, summ, args.round_s, True)
                ref, _ = evaluate(tmp, name, summ, args.round_s, False)
                ratio, rise = achieved(summ)
                results.setdefault(case, []).append((out, delay))
                print(
                    f"{case:8} {i:>3} {out:12} {'' if delay is None else delay:>5} {ref:12} {ratio:>9.2f} {rise:>6.2f}"
                )
    step_ms = statistics.median(periods)
    summary = []
    for case, rs in results.items():
        det = sum(o == "detected" for o, _ in rs)
        fa = sum(o == "false_alarm" for o, _ in rs)
        delays = [dl for o, dl in rs if o == "detected"]
        d = f"{statistics.mean(delays):.0f}" if delays else "-"
        print(f"{case}: detected {det}/{len(rs)}, false alarms {fa}, mean delay {d} steps")
        summary.append(f"{case} det {det}/{len(rs)} fa {fa} delay {d}")
    print(
        f"summary: {'; '.join(summary)}; profiler {cost:.0f} us/step = {100 * cost / 1000 / step_ms:.3f} % of "
        f"a {step_ms:.0f} ms step; wall {time.perf_counter() - t_start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
