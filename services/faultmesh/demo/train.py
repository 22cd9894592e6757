"""The demo's training job: a real PyTorch CPU data-parallel job, instrumented with faultmesh.profiler.

``python -m faultmesh.demo.train --base-dir PROF --task-id JOB [--switch FILE] --slow-file F
--stop-file S`` runs ``--ranks`` (4) processes with ``torch.multiprocessing.spawn``, gloo on
127.0.0.1, TP-like groups of ``--tp`` (2) ranks ([0,1], [2,3]) plus a global all-reduce, one thread
per process, an MLP 256->256x4->10 on a synthetic batch of ``--batch`` (2048), SGD by hand — the
layout measured in ../shared/reference/torch-real-input.md §2 (about 87 ms steps on an idle 2-core box).

Each step writes ``step <n>``, ``dataloader``, ``forward`` (forward + backward + any slowdown) and
both all-reduces (through the instrumented ``torch.distributed``) in the lightweight-profiling record
format under ``<base-dir>/<task-id>/<rank>/``, honouring the data-trace switch file ``--switch``;
``parallel_group.json`` is written after the warm-up.

Run-time control by files (the demo writes them; a job does not need a port for this):

- ``--slow-file``: once it exists, rank ``--slow-rank`` is slowed by ``--factor`` of its own
  compute: ``--slow-mode sleep`` sleeps factor x its median warm-up compute wall time per step (a
  stall, as a throttled device or slow I/O), ``compute`` adds tanh(x @ W) products calibrated in
  thread CPU time under the same contention (reference §2, pitfall 4). The rank prints
  ``slowdown on at step N``.
- ``--stop-file``: once it exists rank 0 raises a flag that rides in the global all-reduce, so all
  ranks stop after the same step; ``--max-steps`` bounds the run in any case.

Rank 0 prints progress every ``--progress-every`` steps (median step time of the window).
``--summary DIR`` writes ``rank<r>.json`` per rank (per-step ms of compute, tp_ar, dp_ar, period
and whether the step was slowed) so the demo reports the slowdown actually achieved.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
import warnings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _say(rank: int, msg: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} rank {rank}: {msg}\n")
    sys.stdout.flush()


def _worker(rank: int, args: argparse.Namespace, port: int) -> None:  # noqa: C901 - one training loop
    os.environ["OMP_NUM_THREADS"] = "1"
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from faultmesh.profiler import Profiler
    from faultmesh.profiler import torch as fpt

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    prof = Profiler(
        rank,
        base_dir=args.base_dir,
        task_id=args.task_id,
        switch_path=args.switch or None,
        flush_interval_s=args.flush_s,
        switch_poll_s=0.5,
    )
    fpt.instrument_distributed(prof)
    tp_group = None
    for start in range(0, args.ranks, args.tp):
        members = list(range(start, min(start + args.tp, args.ranks)))
        g = fpt.new_group(members, "tp")  # every rank creates every group (torch requires it)
        if rank in members:
            tp_group = g
    torch.manual_seed(1234)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
    params = list(model.parameters())
    for p in params:
        dist.broadcast(p.data, 0)
    loss_fn = torch.nn.CrossEntropyLoss()
    extra_x = torch.randn(64, 256)
    extra_w = torch.randn(256, 256) / 16
    stop_in = torch.zeros(1)  # this rank's stop request, summed in the global all-reduce
    stop_seen = [False]  # the reduced value: every rank sees the same one after the same step

    def one_step(n_extra: int, sleep_s: float) -> dict:
        t0 = time.perf_counter_ns()
        with prof.dataloader():
            x = torch.randn(args.batch, 256)
            y = torch.randint(0, 10, (args.batch,))
        c0 = time.perf_counter_ns()
        cc0 = time.thread_time_ns()
        with prof.forward():
            for p in params:
                p.grad = None
            loss = loss_fn(model(x), y)
            loss.backward()
            for _ in range(n_extra):
                torch.tanh(extra_x @ extra_w)
            if sleep_s:
                time.sleep(sleep_s)
        c1 = time.perf_counter_ns()
        cc1 = time.thread_time_ns()
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [stop_in])
        dist.all_reduce(flat, group=tp_group)
        t_tp = time.perf_counter_ns()
        dist.all_reduce(flat)
        t_dp = time.perf_counter_ns()
        stop_seen[0] = flat[-1].item() > 0  # the same sum on every rank
        flat /= args.ranks
        with torch.no_grad():
            off = 0
            for p in params:
                k = p.numel()
                p -= args.lr * flat[off : off + k].view_as(p)
                off += k
        t1 = time.perf_counter_ns()
        return {
            "compute": (c1 - c0) / 1e6,
            "compute_cpu": (cc1 - cc0) / 1e6,
            "tp_ar": (t_tp - c1) / 1e6,
            "dp_ar": (t_dp - t_tp) / 1e6,
            "step": (t1 - t0) / 1e6,
            "loss": float(loss.item()),
        }

    # warm-up, not recorded; calibrate the slowdown under the same contention
    with prof.paused():
        warm = [one_step(0, 0.0) for _ in range(args.warmup)]
        cpu0 = time.thread_time_ns()
        for _ in range(20):
            torch.tanh(extra_x @ extra_w)
        per_extra_cpu = (time.thread_time_ns() - cpu0) / 20 / 1e6
    med_cpu = statistics.median(w["compute_cpu"] for w in warm[2:])
    med_wall = statistics.median(w["compute"] for w in warm[2:])
    n_extra = max(1, round(args.factor * med_cpu / max(per_extra_cpu, 1e-6)))
    sleep_s = args.factor * med_wall / 1000
    dist.barrier()
    fpt.dump_group_info(prof)
    if rank == 0:
        _say(rank, f"warm-up done: compute {med_wall:.1f} ms wall / {med_cpu:.1f} ms CPU per step; training")
    rows: list[dict] = []
    slow_on = False
    last = time.perf_counter_ns()
    window: list[float] = []
    for n in range(args.max_steps):
        if stop_seen[0]:
            break  # every rank leaves after the same step (the flag came through the all-reduce)
        if rank == 0 and args.stop_file and os.path.exists(args.stop_file):
            stop_in[0] = 1.0  # rides in this step's all-reduce; all ranks stop after this step
        if rank == args.slow_rank and not slow_on and args.slow_file and os.path.exists(args.slow_file):
            slow_on = True
            what = (
                f"sleep {sleep_s * 1000:.1f} ms" if args.slow_mode == "sleep" else f"{n_extra} extra products"
            )
            _say(
                rank,
                f"slowdown on at step {n}: {args.slow_mode}, {args.factor:.0%} of compute ({what} per step)",
            )
        with prof.step(n):
            row = one_step(
                n_extra if slow_on and args.slow_mode == "compute" else 0,
                sleep_s if slow_on and args.slow_mode == "sleep" else 0.0,
            )
        now = time.perf_counter_ns()
        row.update(period=(now - last) / 1e6, step_no=n, slow=slow_on, t_ms=time.time() * 1000)
        last = now
        rows.append(row)
        window.append(row["period"])
        if rank == 0 and len(window) >= args.progress_every:
            _say(
                rank, f"step {n}: {statistics.median(window):.0f} ms/step (median of the last {len(window)})"
            )
            window = []
    prof.close()
    dist.barrier()
    if args.summary:
        os.makedirs(args.summary, exist_ok=True)
        with open(os.path.join(args.summary, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "n_extra": n_extra, "sleep_s": sleep_s, "rows": rows}, f)
    if rank == 0:
        _say(rank, f"finished after {len(rows)} steps")
    dist.destroy_process_group()


def build_parser() -> argparse.ArgumentParser:
    """The job's flags (see the module doc)."""
    p = argparse.ArgumentParser(prog="python -m faultmesh.demo.train", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tp", type=int, default=2, help="TP group size")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=5000)
    p.add_argument("--base-dir", required=True, help="profiling root (<root>/<task id>/<rank>/)")
    p.add_argument("--task-id", required=True, help="the job id (names the profiling folder)")
    p.add_argument("--switch", default="", help="data-trace profilingSwitch file (empty: always on)")
    p.add_argument("--flush-s", type=float, default=1.0, help="profiler flush period (s)")
    p.add_argument("--slow-file", default="", help="slow rank --slow-rank down once this file exists")
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--slow-mode", choices=("sleep", "compute"), default="sleep")
    p.add_argument("--factor", type=float, default=0.4, help="slowdown as a fraction of the rank's compute")
    p.add_argument(
        "--stop-file", default="", help="stop (all ranks after the same step) once this file exists"
    )
    p.add_argument("--progress-every", type=int, default=50, help="rank 0 prints progress every N steps")
    p.add_argument("--summary", default="", help="folder for per-rank rank<r>.json step summaries")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the job; returns 0 when every rank finished."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(args, _free_port()), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
