"""A real PyTorch CPU training job instrumented with faultmesh.profiler (needs ``faultmesh[torch]``).

The job of ../shared/reference/torch-real-input.md §2: ``--ranks`` processes (4) via
``torch.multiprocessing.spawn``, gloo on 127.0.0.1, TP-like groups of 2 ranks ([0,1], [2,3]) plus a
global all_reduce, one thread per process, an MLP 256->256 x ``--layers`` (4) ->10 on a synthetic
batch of ``--batch`` (2048), SGD by hand, 8 warm-up steps (not recorded); ``--steps`` steps, or
fewer when ``--stop-file`` appears (the stop flag rides in the global all-reduce so every rank
stops after the same step). From step ``--slow-from`` (``-1``: never by step), or once the file
``--slow-file`` exists (how the demo triggers it at run time), rank ``--slow-rank`` is slowed
down, in every compute segment (the compute between two TP collectives) by ``--factor`` x that
segment's median over the warm-up (measured while every rank runs; :class:`~faultmesh.profiler.slowdown.Pace`):

- ``--slow-mode compute``: extra ``tanh(x @ W)`` products worth ``--factor`` x the segment's
  *thread CPU time* (a card that runs every kernel slower: forward and backward alike);
- ``--slow-mode sleep``: a sleep of ``--factor`` x the segment's wall time (a stall);
- ``--slow-mode dataloader``: its data loader sleeps ``--factor`` x its median compute wall time.

With ``--tp-in-forward`` (the default) the TP collectives sit where Megatron puts them, inside the
forward range (which spans forward + backward): every hidden layer's forward ends with an
all-reduce of ``--tp-elems`` elements on the TP group (the row-parallel output) and every hidden
layer's backward but the first layer's with one (the column-parallel input gradient,
:class:`_BackwardTP`); the TP members show the same forward time and a slow rank shows as the one
that arrives last at each per-operation barrier and computes longer between them (issue 16).
``--no-tp-in-forward`` is the earlier shape (one segment, TP collective after the forward range).

``--parallel ddp`` (issue 34) is the data-parallel-only job: no TP group, one ``dp`` group of every
rank, the model wrapped in ``torch.nn.parallel.DistributedDataParallel`` with ``--bucket-mb``
(0.25) gradient buckets (4 a step for the default model), each all-reduced asynchronously as soon
as the backward filled it and recorded by the profiler from launch to completion
(:func:`faultmesh.profiler.torch.record_ddp_buckets`); the compute before each bucket's launch is
one segment (the first: the forward and the backward up to it), so a slowed rank launches every
bucket late; only the stop flag is all-reduced after the backward (``dp_ar`` in the summary).
``--parallel fsdp`` is the same job fully sharded (FSDP2, ``torch.distributed.fsdp.fully_shard``
over the ``dp`` group, each linear layer a unit): every layer's forward all-gathers its parameters
and the backward reduce-scatters its gradients (recorded as ``all_gather_single`` /
``reduce_scatter_single``); the compute before each layer's all-gather is one segment, so a slowed
rank reaches every forward all-gather late.

Each step records ``step <n>`` / ``dataloader`` / ``forward`` (forward + backward + the slowdown)
and the collectives through the instrumented ``torch.distributed``; ``parallel_group.json`` is
written after warm-up. With ``--summary DIR`` each rank writes ``rank<r>.json`` with per-step
phase times (ms: compute, compute_cpu, gap and gap_cpu -- the compute between TP collectives, the
slowdown included, which the gap rule judges; ``gaps`` the same per segment --, tp_ar, dp_ar,
period; ``slow``, ``factor``) and
the per-segment slowdowns (``segments``) so tests assert what was achieved; each step's row is
also appended to ``rank<r>.steps.jsonl`` as it ends, so a test can measure the achieved slowdown
while the job runs and raise it through ``--factor-file`` (the slow rank re-reads the factor when
the file changes, :class:`~faultmesh.profiler.slowdown.FactorFile`). Rank 0 prints ``warm-up done``, ``slowdown on at step N`` (the slow rank), the median step
time every ``--progress-every`` steps and ``finished after N steps``. This is the one training job of
the project: the demo, the real-torch test and bench/slownode_torch.py all run it.

Usage: ``python -m faultmesh.profiler.example_job --base-dir D --task-id J --switch F --steps 150``.

Across hosts it runs the way torchrun launches a job (:func:`rendezvous`): with ``RANK`` and
``WORLD_SIZE`` in the environment (torchrun sets them, with ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``) the process is that one rank and spawns nothing, ``--ranks`` is ``WORLD_SIZE``;
e.g. on each of two hosts ``python -m torch.distributed.run --nnodes 2 --node-rank <0|1>
--nproc-per-node 2 --master-addr <host 0's IP> --master-port 29500 -m faultmesh.profiler.example_job
...``. Without them it spawns ``--ranks`` processes itself, meeting at ``MASTER_ADDR`` (127.0.0.1)
``MASTER_PORT`` (a free port) -- the single-host default. Launched across hosts, gloo uses the
interface that routes to ``MASTER_ADDR`` (:func:`gloo_interface`) unless ``GLOO_SOCKET_IFNAME`` says.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

from faultmesh.config import non_negative_float, positive_float, positive_int
from faultmesh.profiler.launch import Rendezvous, gloo_interface, rendezvous
from faultmesh.profiler.slowdown import FactorFile, Pace


def _say(rank: int, msg: str) -> None:
    sys.stdout.write(f"{time.strftime('%H:%M:%S')} rank {rank}: {msg}\n")
    sys.stdout.flush()


def _worker(rank: int, args: argparse.Namespace, rdzv: Rendezvous) -> None:  # noqa: C901 - one training loop
    os.environ["OMP_NUM_THREADS"] = "1"
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    from faultmesh.profiler import Profiler
    from faultmesh.profiler import torch as fpt

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    init = f"tcp://{rdzv.master_addr}:{rdzv.master_port}"
    if rdzv.rank is not None and not os.environ.get("GLOO_SOCKET_IFNAME"):
        iface = gloo_interface(rdzv.master_addr, rdzv.master_port)
        if iface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = iface[0]
            _say(
                rank, f"gloo on {iface[0]} ({iface[1]}), the interface toward MASTER_ADDR {rdzv.master_addr}"
            )
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    prof = Profiler(
        rank,
        base_dir=args.base_dir,
        task_id=args.task_id,
        switch_path=args.switch or None,
        flush_interval_s=args.flush_s,
        switch_poll_s=args.switch_poll_s,
    )
    fpt.instrument_distributed(prof)
    tp_group = dp_group = None
    if args.parallel != "tp":  # data parallel only: one "dp" group of every rank, no TP group
        dp_group = fpt.new_group(list(range(args.ranks)), "dp")
    for start in range(0, args.ranks, args.tp) if args.parallel == "tp" else ():
        g = fpt.new_group(list(range(start, min(start + args.tp, args.ranks))), "tp")
        if rank in range(start, start + args.tp):
            tp_group = g
    torch.manual_seed(1234)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    head = torch.nn.Linear(256, 10)
    model = torch.nn.Sequential(*layers, head)
    hidden = [m for m in layers if isinstance(m, torch.nn.Linear)]
    params = list(model.parameters())
    for p in params:
        dist.broadcast(p.data, 0)
    loss_fn = torch.nn.CrossEntropyLoss()
    extra_x = torch.randn(64, 256)
    extra_w = torch.randn(256, 256) / 16
    world = args.ranks

    stop_flag = torch.zeros(1)

    tp_x = torch.zeros(args.tp_elems)
    pace = Pace(torch, extra_x, extra_w)
    ddp = None
    if args.parallel == "ddp":
        # DDP's gradient buckets, each all-reduced as soon as the backward filled it; the compute
        # before each bucket's launch is one segment (the first: the forward and the backward up to it)
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, process_group=dp_group, bucket_cap_mb=args.bucket_mb)
        fpt.record_ddp_buckets(ddp, prof, dp_group, lambda i: pace.end(f"g{i}"), pace.start)
    elif args.parallel == "fsdp":
        # FSDP2: every linear layer sharded over the dp group; its forward all-gathers the layer's
        # parameters (the backward reduce-scatters its gradients); the compute before each layer's
        # all-gather is one segment (a hook ahead of FSDP's own)
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(dp_group, "cpu")
        for i, m in enumerate([*hidden, head]):
            fully_shard(m, mesh=mesh)
            m.register_forward_pre_hook(lambda _m, _x, i=i: pace.end(f"f{i}") or pace.start(), prepend=True)
        ddp = fully_shard(model, mesh=mesh)
        params = list(model.parameters())  # the shards (DTensors) the update steps

    def tp_all_reduce(seg: str, tag: float) -> None:
        # The end of one compute segment: the slowdown of that segment, then the TP collective.
        pace.end(seg)
        tp_x[0] = tag
        dist.all_reduce(tp_x, group=tp_group)
        pace.start()

    class _BackwardTP(torch.autograd.Function):
        """Megatron's copy-to-TP-region: identity forward; in backward, the layer's input
        gradient is all-reduced over the TP group (one TP collective per layer's backward)."""

        @staticmethod
        def forward(ctx, h, i):  # noqa: ANN001 - torch.autograd.Function signature
            ctx.i = i
            return h.view_as(h)

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001
            tp_all_reduce(f"b{ctx.i}", -float(ctx.i))
            return grad, None

    def one_step() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        with prof.dataloader():
            x = torch.randn(args.batch, 256)
            y = torch.randint(0, 10, (args.batch,))
            if pace.loader_sleep_s:
                time.sleep(pace.loader_sleep_s)
        c0, cc0 = time.perf_counter_ns(), time.thread_time_ns()
        pace.new_step()
        with prof.forward():
            pace.start()
            for p in params:
                p.grad = None
            if ddp is not None:
                loss = loss_fn(ddp(x), y)
                loss.backward()  # DDP: every bucket's slowdown, then its all-reduce (record_ddp_buckets)
            elif args.tp_in_forward:
                # Megatron: every layer's forward ends with a TP all-reduce (row-parallel output),
                # every layer's backward but the first layer's with one (column-parallel input
                # gradient) -- all inside the forward range; a slow rank is slow in every segment.
                h = x
                for i, layer in enumerate(hidden):
                    if i:
                        h = _BackwardTP.apply(h, i)
                    h = torch.relu(layer(h))
                    tp_all_reduce(f"f{i}", float(i))
                loss = loss_fn(head(h), y)
                loss.backward()
                pace.end("b0")  # the first layer's backward: its gradient goes to the grad all-reduce
            else:
                loss = loss_fn(model(x), y)
                loss.backward()
                pace.end("all")
        c1, cc1 = time.perf_counter_ns(), time.thread_time_ns()
        if ddp is None:
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [stop_flag])
            dist.all_reduce(flat, group=tp_group)
            t_tp = time.perf_counter_ns()
            dist.all_reduce(flat)
            t_dp = time.perf_counter_ns()
            stop_flag[0] = flat[-1].item()
            flat /= world
            grads, off = [], 0
            for p in params:
                grads.append(flat[off : off + p.numel()].view_as(p))
                off += p.numel()
        else:  # DDP averaged (FSDP reduce-scattered) the gradients in the backward; the stop flag alone
            t_tp = c1
            dist.all_reduce(stop_flag)
            t_dp = time.perf_counter_ns()
            grads = [p.grad for p in params]
        stop_flag[0] = 1.0 if stop_flag[0] > 0 else 0.0  # every rank sees the same sum
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= args.lr * g
        t1 = time.perf_counter_ns()
        return {
            "compute": (c1 - c0) / 1e6,
            "compute_cpu": (cc1 - cc0) / 1e6,
            "gap": pace.gap_ns / 1e6,
            "gap_cpu": pace.gap_cpu_ns / 1e6,
            "gaps": [round(g / 1e6, 3) for g in pace.gaps_ns],
            "tp_ar": (t_tp - c1) / 1e6,
            "dp_ar": (t_dp - t_tp) / 1e6,
            "step": (t1 - t0) / 1e6,
        }

    # Warm-up (not recorded): each segment's compute, measured under the same contention.
    with prof.paused():
        pace.recording = True
        warm = [one_step() for _ in range(args.warmup)]
        pace.recording = False
    pace.calibrate(args.factor, skip=2)
    med_cpu = statistics.median(w["compute_cpu"] for w in warm[2:])
    med_wall = statistics.median(w["compute"] for w in warm[2:])
    n_extra = sum(pace.n_extra.values())
    sleep_s = sum(pace.sleep_s.values())
    factor_loader_s = args.factor * med_wall / 1000
    dist.barrier()
    fpt.dump_group_info(prof)
    if rank == 0:
        _say(rank, f"warm-up done: compute {med_wall:.1f} ms wall / {med_cpu:.1f} ms CPU per step; training")
    rows = []
    slow_on = False
    factor_file = FactorFile(args.factor_file if rank == args.slow_rank else "")
    live = None
    if args.summary:  # each step as it ends, so a test can measure the achieved slowdown live
        os.makedirs(args.summary, exist_ok=True)
        live = open(os.path.join(args.summary, f"rank{rank}.steps.jsonl"), "w", buffering=1)  # noqa: SIM115
    window: list[float] = []
    last = time.perf_counter_ns()
    for n in range(args.steps):
        if stop_flag[0] > 0:  # set by the previous step's global all-reduce: the same on every rank
            break
        if rank == 0 and args.stop_file and os.path.exists(args.stop_file):
            stop_flag[0] = 1.0  # travels in this step's all-reduces; every rank stops after it
        if rank == args.slow_rank and not slow_on and args.slow_mode != "none":
            by_step = 0 <= args.slow_from <= n
            by_file = bool(args.slow_file) and os.path.exists(args.slow_file)
            if by_step or by_file:
                slow_on = True
                what = {
                    "sleep": f"sleep {sleep_s * 1000:.1f} ms",
                    "dataloader": f"data loader sleeps {factor_loader_s * 1000:.1f} ms",
                    "compute": f"{n_extra} extra products",
                }[args.slow_mode]
                _say(
                    rank,
                    f"slowdown on at step {n}: {args.slow_mode}, {pace.factor:.0%} of compute ({what} per step)",
                )
        new_factor = factor_file.poll()
        if new_factor is not None and new_factor != pace.factor:
            pace.set_factor(new_factor)
            n_extra = sum(pace.n_extra.values())
            sleep_s = sum(pace.sleep_s.values())
            factor_loader_s = new_factor * med_wall / 1000
            _say(
                rank,
                f"slowdown factor now {new_factor:.0%} at step {n} ({n_extra} extra products, "
                f"sleep {sleep_s * 1000:.1f} ms per step when on)",
            )
        slow = slow_on
        pace.mode = args.slow_mode if slow else "none"
        pace.loader_sleep_s = factor_loader_s if slow and args.slow_mode == "dataloader" else 0.0
        with prof.step(n):
            row = one_step()
        now = time.perf_counter_ns()
        row["period"] = (now - last) / 1e6
        row["step_no"] = n
        row["t_ms"] = time.time_ns() // 1_000_000
        row["slow"] = slow
        row["factor"] = pace.factor if slow else 0.0
        last = now
        rows.append(row)
        if live is not None:
            live.write(json.dumps(row) + "\n")
        window.append(row["period"])
        if rank == 0 and args.progress_every and len(window) >= args.progress_every:
            _say(
                rank, f"step {n}: {statistics.median(window):.0f} ms/step (median of the last {len(window)})"
            )
            window = []
    prof.close()
    if live is not None:
        live.close()
    dist.barrier()
    if args.summary:
        with open(os.path.join(args.summary, f"rank{rank}.json"), "w") as f:
            json.dump(
                {
                    "rank": rank,
                    "n_extra": n_extra,
                    "sleep_s": sleep_s,
                    "per_extra_cpu_ms": pace.per_extra_cpu_ms,
                    "segments": pace.summary(),
                    "dropped_records": prof.dropped_records,
                    "written_records": prof.written_records,
                    "rows": rows,
                },
                f,
            )
    if rank == 0:
        _say(rank, f"finished after {len(rows)} steps")
    dist.destroy_process_group()


def build_parser() -> argparse.ArgumentParser:
    """Command-line flags of the job (see module doc)."""
    p = argparse.ArgumentParser(
        prog="python -m faultmesh.profiler.example_job",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--ranks", type=positive_int, default=4, help="ranks (processes) of the job")
    p.add_argument("--tp", type=positive_int, default=2, help="TP group size")
    p.add_argument(
        "--parallel",
        choices=("tp", "ddp", "fsdp"),
        default="tp",
        help="tp: TP groups of --tp ranks + a global gradient all-reduce; ddp: DistributedDataParallel "
        "only; fsdp: FSDP2 (fully_shard) only",
    )
    p.add_argument(
        "--bucket-mb", type=positive_float, default=0.25, help="DDP gradient bucket size, MB (--parallel ddp)"
    )
    p.add_argument("--steps", type=positive_int, default=60, help="training steps after the warm-up")
    p.add_argument("--warmup", type=positive_int, default=8, help="warm-up steps, not recorded (>= 3)")
    p.add_argument("--batch", type=positive_int, default=2048, help="samples per step and rank")
    p.add_argument("--layers", type=positive_int, default=4, help="hidden layers (256 -> 256)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument(
        "--progress-every", type=int, default=0, help="rank 0 prints the median step time every N steps"
    )
    p.add_argument("--slow-rank", type=int, default=2, help="the rank slowed (--slow-mode)")
    p.add_argument("--slow-from", type=int, default=30, help="slow down from this step (-1: never by step)")
    p.add_argument("--slow-file", default="", help="slow down once this file exists (the demo's trigger)")
    p.add_argument("--slow-mode", choices=("none", "sleep", "compute", "dataloader"), default="none")
    p.add_argument(
        "--factor",
        type=non_negative_float,
        default=0.4,
        help="slowdown: 0.4 = +40 %% of each segment's compute",
    )
    p.add_argument(
        "--factor-file",
        default="",
        help="the slow rank re-reads its slowdown factor from this file once a step when it changes",
    )
    p.add_argument(
        "--tp-in-forward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a TP all-reduce after each layer inside the forward range, as Megatron (default on)",
    )
    p.add_argument(
        "--tp-elems", type=positive_int, default=16384, help="elements of each in-forward TP all-reduce"
    )
    p.add_argument("--base-dir", required=True, help="profiling root (<root>/<task id>/<rank>/)")
    p.add_argument("--task-id", required=True)
    p.add_argument("--switch", default="", help="profilingSwitch file (empty: always on)")
    p.add_argument("--flush-s", type=float, default=1.0)
    p.add_argument("--switch-poll-s", type=float, default=0.5)
    p.add_argument("--stop-file", default="", help="stop early (all ranks together) once this file exists")
    p.add_argument("--summary", default="", help="directory for per-rank rank<r>.json summaries")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the job (this one rank when launched by torchrun, else ``--ranks`` spawned processes);
    returns 0 when the ranks finished, exits 2 on a bad torchrun variable."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup < 3:  # the first two are left out of the slowdown's calibration
        parser.error(f"--warmup {args.warmup}: at least 3 steps")
    try:
        rdzv = rendezvous()
    except ValueError as e:
        parser.error(str(e))
    world = rdzv.world_size or args.ranks
    if args.parallel == "tp" and world % args.tp:
        parser.error(f"--tp {args.tp}: the job's {world} ranks do not split into TP groups of {args.tp}")
    if args.slow_mode != "none" and not 0 <= args.slow_rank < world:
        parser.error(f"--slow-rank {args.slow_rank}: not a rank of the job's {world} (0..{world - 1})")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore")
    if rdzv.rank is not None:  # launched: this process is one rank of WORLD_SIZE
        args.ranks = rdzv.world_size
        _worker(rdzv.rank, args, rdzv)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(args, rdzv), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
