"""``faultmesh up``: the local stack of the demo without the scenario, for trying things by hand.

Starts clusterd and, per simulated server, a BMC simulator, noded and deviced (sim backend) on
127.0.0.1 (plus pingmesh on the fabric simulator when installed), prints every address and the
commands to inject faults, and runs until Ctrl-C (or SIGTERM), which stops every process by PID
and exits 130 (as ``faultmesh demo``); 1 when the stack did not start.
A process that crashes is reported and restarted with backoff (the rest of the stack keeps running).

``--with-job`` also starts the demo's example training job: the real 4-rank PyTorch CPU job
(``faultmesh.profiler.example_job``, ranks 0,1 on server-1 and 2,3 on the fourth or last server;
``--with-job ddp``: its data-parallel-only variant, DistributedDataParallel without TP groups),
registered with ``faultmesh job apply``, its TaskD stand-in ``faultmesh trainsim``, and FD-OL
slow-node detection enabled for it (``faultmesh slownode enable``); the TRY list then names the
file that slows rank 2 and the commands that show what clusterd concludes. The job is not
restarted when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path

from faultmesh.config import positive_float
from faultmesh.log import FORMATS, log_level_arg
from faultmesh.runtime import wait_for
from fmtools.cli.common import UsageError, run
from fmtools.demo.fleetargs import add_fleet_args


async def _up(args: argparse.Namespace) -> int:
    from fmtools.demo.__main__ import where_text
    from fmtools.demo.report import Clock
    from fmtools.demo.stack import Stack, StackConfig, StackError

    clock = Clock()
    run_dir = Path(args.run_dir)
    cfg = StackConfig(
        servers=args.servers,
        gpu_servers=args.gpu_servers,
        npus=args.npus,
        bmc_poll_s=args.bmc_poll,
        list_watch_s=args.list_watch,
        pingmesh_period_s=args.pingmesh_period,
        log_level=args.log_level,
        log_format=args.log_format,
    )
    stack = Stack(cfg, run_dir, say=clock.say)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    status = 0
    try:
        start = loop.create_task(stack.start())
        waiter = loop.create_task(stop.wait())
        done, _ = await asyncio.wait({start, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if start in done:
            start.result()  # raises StackError
            if args.with_job:
                await _start_job(stack, clock, args.with_job)
            print()
            print(where_text(stack, demo=False, job=bool(args.with_job)))
            print(_howto(stack, job=bool(args.with_job)))
            clock.say("stack running; Ctrl-C stops every process")
            await _supervise(stack, stop, clock.say, args)
            status = 130  # stopped by Ctrl-C or SIGTERM, as `faultmesh demo` exits
        else:
            start.cancel()
            status = 130
        waiter.cancel()
    except StackError as e:
        clock.say(f"the stack did not start: {e}")
        status = 1
    finally:
        clock.say("stopping every process by PID")
        await stack.stop()
        stack.procs.stop_all_now()
        clock.say(f"stopped {len(stack.procs.children)} processes; logs in {stack.log_dir}")
    return status


async def _start_job(stack, clock, parallel: str) -> None:
    """The demo's job set-up (job apply, trainsim, slownode enable, the PyTorch job); a part that
    fails is reported and the stack keeps running."""
    from fmtools.demo.harness import Harness, Timing

    h = Harness(stack, clock, Timing())
    h.job_steps = 1_000_000
    h.job_parallel = parallel
    await h.setup_job()
    if h.job_error:
        clock.say(f"the example job is not complete: {h.job_error}")


async def _supervise(stack, stop: asyncio.Event, say, args: argparse.Namespace) -> None:
    """Until ``stop``: a process that exited unasked is reported and started again with the same
    command line after a backoff (``--restart-initial-s`` doubling to ``--restart-max-s``; reset
    once a run lasted ``--restart-healthy-s``), so an agent crash can be rehearsed."""
    from faultmesh.retry import Backoff

    backoffs: dict[str, Backoff] = {}
    due: dict[str, float] = {}  # name -> monotonic time of its restart
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            await wait_for(stop.wait(), args.supervise_s)
            return
        except TimeoutError:
            pass
        for c in stack.procs.dead():
            if c.name in due:
                continue
            if c.name == "train":  # the example job ran to its end (or failed): not a daemon
                c.stopping = True
                say(f"the example job ended (exit {c.proc.returncode}, {c.log_path}); not restarted")
                continue
            b = backoffs.setdefault(
                c.name, Backoff(args.restart_initial_s, args.restart_max_s, 0.0, args.restart_healthy_s)
            )
            b.success_after(time.monotonic() - c.started_s)
            delay = b.next_delay()
            due[c.name] = loop.time() + delay
            say(
                f"process exited: {c.name} (exit {c.proc.returncode}, {c.log_path}); restarting in {delay:.1f} s"
            )
        for name, t in list(due.items()):
            if loop.time() < t:
                continue
            old = stack.procs.get(name)
            del due[name]
            if old is None or old.alive:
                continue
            stack.procs.children.remove(old)  # the restarted one takes its place
            try:
                new = await stack.procs.start(name, old.argv)
            except OSError as e:
                say(f"process restart failed: {name}: {e.strerror or e}")
                stack.procs.children.append(old)
                continue
            say(f"process restarted: {name} (pid {new.pid})")


def _howto(stack, job: bool = False) -> str:
    """The TRY list: every action through the faultmesh CLI (the fabric simulator has its own)."""
    from fmtools.demo.harness import JOB, SLOW_RANK

    s1, s2 = stack.servers[0], stack.servers[min(1, len(stack.servers) - 1)]
    at = f"--http {stack.http}"
    lines = [
        "",
        "TRY (with .venv/bin on PATH, or prefix the commands with .venv/bin/)",
        f"  faultmesh faults {at}",
        f"  faultmesh nodes {at}",
        f"  faultmesh bmc-sim inject --control {s2.bmc_control} --code 0800004B --device-type 'PCIe Card' --device-id 3",
        f"  faultmesh device-sim --sim {s1.deviced_http} fault 0 80E18008",
        f"  faultmesh device-sim --sim {s1.deviced_http} link 4 down",
        f"  faultmesh pubfault send {at} --grpc {stack.grpc} --code 020001001 --node {s1.name} --devices 5",
        f"  faultmesh history --node {s1.name} {at}",
    ]
    gpu = next((s for s in stack.servers if s.gpu), None)
    if gpu is not None:  # a mixed fleet: XID 79 (4E560000004F) on GPU 3 of the simulated GPU server
        lines += [
            f"  faultmesh device-sim --sim {gpu.deviced_http} fault 3 4E560000004F   # XID 79 on {gpu.name} GPU 3",
            "  faultmesh explain xid 79",
        ]
    if stack.fabric_file is not None:
        lines.append(
            f"  python -m fmtools.sims.fabric inject {stack.fabric_file} lossy_link "
            f"--a {s2.name}/1 --b {s2.name}/6 --loss 0.3"
        )
    if job:
        lines += [
            f"  faultmesh jobs {at}",
            f"  faultmesh job recovery --job {JOB} {at}",
            f"  faultmesh stress-test --job {JOB} --ops aic,p2p --grpc {stack.grpc} {at}",
            f"  touch {stack.run_dir / 'slow-rank'}   # slows rank {SLOW_RANK} of the job by 40 % (a stall)",
            f"  faultmesh slownode status --job {JOB} {at}",
        ]
    return "\n".join(lines)


@run
def cmd_up(args: argparse.Namespace) -> int:
    """Run the local stack until Ctrl-C (then exit 130)."""
    if args.servers < 1 or args.npus < 8 or args.npus % 8:
        raise UsageError("--servers must be >= 1 and --npus a multiple of 8")
    if args.with_job and args.servers < 2:
        raise UsageError("--with-job places ranks on two servers: use --servers 2 or more")
    args.run_dir = args.run_dir or f"/tmp/faultmesh-up-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        (Path(args.run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--run-dir {args.run_dir}: {e.strerror or e}") from None
    return asyncio.run(_up(args))


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``faultmesh up``."""
    p = sub.add_parser(
        "up",
        help="run the local stack (clusterd + simulated servers) until Ctrl-C",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--run-dir", help="folder for logs and state (default: /tmp/faultmesh-up-<date>-<time>)")
    add_fleet_args(p, gpu_servers=0, gpu_max=64, servers_help="simulated servers")
    p.add_argument(
        "--with-job",
        nargs="?",
        const="tp",
        choices=("tp", "ddp"),
        help="also start the example PyTorch job (4 CPU ranks, needs faultmesh[torch]) with slow-node "
        "detection: tp (the default: TP groups [0,1] [2,3]) or ddp (DistributedDataParallel, no TP group)",
    )
    p.add_argument(
        "--log-level", type=log_level_arg, default="INFO", help="log level of the started processes"
    )
    p.add_argument(
        "--log-format", choices=FORMATS, default="text", help="log format of the started processes"
    )
    p.add_argument(
        "--restart-initial-s",
        type=positive_float,
        default=1.0,
        help="first restart delay of a crashed process (s)",
    )
    p.add_argument("--restart-max-s", type=positive_float, default=30.0, help="longest restart delay (s)")
    p.add_argument(
        "--restart-healthy-s", type=float, default=60.0, help="a run this long resets the restart delay (s)"
    )
    p.add_argument("--supervise-s", type=float, default=1.0, help=argparse.SUPPRESS)  # check period
    p.set_defaults(func=cmd_up)
