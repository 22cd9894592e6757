"""noded's slow-node part (reader, per-rank step assembly, node rounds) against the reference's
budget for its parser: 150m CPU and 128Mi memory (the reference's NodeD deployment gives the
slow-node parser these limits; issue 34).

A writer (this process) appends 16 ranks' lightweight-profiling records into a job directory at a
realistic rate while a child process runs noded's node part on it exactly as noded does
(``noded.slownode._round``: ``JobReader.poll``, the ranks' ``StepAssembler``, ``NodeDetector`` with
faultmesh's rules), one round every ``--round-s`` seconds. The job: 16 ranks, TP 8 x PP 2
(bench/trainsim_tp.py ``layout_for(16)``: two nodes' ranks on this one, more than one node holds),
``--micro`` micro-batches of ``--ops`` TP all-reduces each per step (Megatron-LM, Narayanan et al.,
SC'21: 2 all-reduces per layer in the forward, 2 in the backward; a 32-layer model on 2 stages with
8 micro-batches records ~8 x 32 TP collectives per rank and step, host and device ranges), a step
every ``--step-s`` seconds (2 s: a fast step for such a job; 7B-class models on 16 cards take
several seconds per step, so this is the heavier end).

The child measures its own CPU time (user + system, ``os.times``) and RSS (/proc/self/status
VmRSS, peak VmHWM) over the measured span (after ``--warmup`` s) and, before any record is read,
its RSS with the imports done (the floor: Python + numpy + fdol). CPU is given in millicores
(CPU seconds per wall second x 1000). The writer's own cost is not counted.

Usage: ``python bench/slownode_noded_budget.py [--duration 60] [--step-s 2] [--round-s 10]``.
Last line: the figures beside the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUDGET_M, BUDGET_MI = 150, 128


def _status(key: str) -> float:
    """A /proc/self/status field in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(job_dir: str, ranks: int, round_s: float, duration: float, warmup: float) -> None:
    """Run noded's node part on ``job_dir`` for ``duration`` s; print one JSON line of figures."""
    from fdol.slownode.featconf import parse_featconf
    from fdol.slownode.metrics import StepAssembler
    from fdol.slownode.node import NodeDetector
    from fdol.slownode.reader import JobReader
    from noded.slownode import NodeJob, _round

    floor = _status("VmRSS")
    conf = parse_featconf({"jobName": "budget", "jobId": "budget", "nSecondsDoOneDetection": round_s})
    rs = list(range(ranks))
    reader = JobReader(job_dir, rs, start_time_s=None)
    asm = {
        r: StepAssembler(r, lambda r=r: reader.groups(r), traffic=conf.traffic, bad=reader.bad) for r in rs
    }
    nj = NodeJob(conf, rs, reader, asm, NodeDetector(conf, rs, "node-0", reader.bad))
    t_start = time.monotonic()
    nxt = t_start + round_s
    steps = 0
    rounds = []
    cpu0 = wall0 = None
    while time.monotonic() < t_start + duration:
        time.sleep(max(0.0, nxt - time.monotonic()))
        nxt += round_s
        t = time.thread_time()
        n, _ = _round(nj)
        rounds.append((time.thread_time() - t) * 1000)
        steps += n
        if cpu0 is None and time.monotonic() - t_start >= warmup:
            c = os.times()
            cpu0, wall0, steps0 = c.user + c.system, time.monotonic(), steps
    c = os.times()
    wall = time.monotonic() - (wall0 or t_start)
    out = {
        "cpu_m": 1000 * (c.user + c.system - (cpu0 or 0.0)) / wall,
        "rss_mi": _status("VmRSS"),
        "hwm_mi": _status("VmHWM"),
        "floor_mi": floor,
        "rank_steps_per_s": (steps - (steps0 if cpu0 is not None else 0)) / wall,
        "round_ms_max": max(rounds) if rounds else 0.0,
        "round_ms_median": sorted(rounds)[len(rounds) // 2] if rounds else 0.0,
        "bad": dict(reader.bad),
    }
    print(json.dumps(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds before the measured span")
    ap.add_argument("--step-s", type=float, default=2.0, help="seconds per training step")
    ap.add_argument("--round-s", type=float, default=10.0, help="seconds per node round (reference: 30)")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--ops", type=int, default=32, help="TP all-reduces per micro-batch")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, 16, args.round_s, args.duration, args.warmup)
        return 0
    sys.path.insert(0, str(HERE))
    from trainsim_tp import Sim, SimConf, layout_for

    sim = Sim(layout_for(16), SimConf(micro=args.micro, k_ops=args.ops, seed=1))
    with tempfile.TemporaryDirectory() as d:
        sim.write_groups(Path(d))
        sim.write_steps(Path(d), 1)
        cmd = [sys.executable, __file__, "--child", d, "--duration", str(args.duration)]
        cmd += ["--round-s", str(args.round_s), "--warmup", str(args.warmup)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        n = 0
        size = 0
        try:
            while proc.poll() is None and time.monotonic() - t0 < args.duration + 5:
                sim.write_steps(Path(d), 1)
                n += 1
                time.sleep(max(0.0, t0 + n * args.step_s - time.monotonic()))
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        files = list(Path(d).rglob("1700000000"))
        size = sum(f.stat().st_size for f in files)
        lines = sum(f.read_bytes().count(b"\n") for f in files)
    fig = json.loads(out.strip().splitlines()[-1])
    rec_s = lines / (n * args.step_s)
    print(
        f"fed {n} steps of 16 ranks, {size / 1e6:.1f} MB, ~{rec_s / 1000:.1f} k records/s; bad input {fig['bad']}"
    )
    print(
        f"summary: cpu_m {fig['cpu_m']:.0f} (budget {BUDGET_M}m) rss_mi {fig['rss_mi']:.0f} peak {fig['hwm_mi']:.0f} "
        f"(budget {BUDGET_MI}Mi; imports alone {fig['floor_mi']:.0f}) rank_steps_per_s {fig['rank_steps_per_s']:.2f} "
        f"round_ms median {fig['round_ms_median']:.0f} max {fig['round_ms_max']:.0f}; step_s {args.step_s:g} "
        f"round_s {args.round_s:g} micro {args.micro} ops {args.ops}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
