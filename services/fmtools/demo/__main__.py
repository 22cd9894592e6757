"""``python -m fmtools.demo`` (``make demo``): the whole stack on this machine, a scripted fault
scenario, and a summary table. Exit status 0 only when every injected fault was detected right.

Flags set the intervals (the CI end-to-end test passes shorter ones); there is no other mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from importlib import resources
from pathlib import Path

from faultmesh.config import positive_float, positive_int
from faultmesh.log import log_level_arg
from fmtools.demo.fleetargs import add_fleet_args
from fmtools.demo.report import MISSING, Clock, all_right, table
from fmtools.demo.scenario import Scenario, Timing
from fmtools.demo.stack import Stack, StackConfig, StackError


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line. Every interval has the real rule's value as its default."""
    p = argparse.ArgumentParser(prog="python -m fmtools.demo", description=__doc__)
    p.add_argument(
        "--run-dir",
        help="folder for logs, state and data (default: /tmp/faultmesh-demo-<date>-<time>)",
    )
    add_fleet_args(p, gpu_servers=1, gpu_max=8, servers_help="simulated servers (the scenario needs 4)")
    p.add_argument(
        "--detect-timeout", type=positive_float, default=30.0, help="how long a step waits for clusterd (s)"
    )
    p.add_argument("--link-down", type=positive_float, default=25.0, help="how long the link stays down (s)")
    p.add_argument(
        "--link-recover",
        type=positive_float,
        default=60.0,
        help="81078603 RecoverTimeout given to deviced (s)",
    )
    p.add_argument(
        "--slownode-round", type=positive_float, default=1.0, help="FD-OL nSecondsDoOneDetection (s)"
    )
    p.add_argument(
        "--slow-after-steps",
        type=positive_int,
        default=60,
        help="clean training steps before rank 2 is slowed",
    )
    p.add_argument(
        "--slow-mode",
        choices=("sleep", "compute"),
        default="sleep",
        help="how rank 2 is slowed by 40%%: a stall (sleep) or extra CPU work (compute)",
    )
    p.add_argument(
        "--report-timeout",
        type=positive_float,
        default=60.0,
        help="clusterd's wait for each training-side report (s)",
    )
    p.add_argument(
        "--log-level", type=log_level_arg, default="INFO", help="log level of the started processes"
    )
    return p


def demo_config(args: argparse.Namespace, run_dir: Path) -> StackConfig:
    """The stack configuration for the demo flags (writes deviced's fault customization file)."""
    custom = run_dir / "faultCustomization.json"
    custom.write_text(json.dumps(link_rule_table(args.link_recover), indent=2) + "\n")
    cfg = StackConfig(
        servers=args.servers,
        gpu_servers=args.gpu_servers,
        npus=args.npus,
        bmc_poll_s=args.bmc_poll,
        list_watch_s=args.list_watch,
        pingmesh_period_s=args.pingmesh_period,
        report_timeout_s=args.report_timeout,
        log_level=args.log_level,
        extra={"deviced": ["--fault-customization-file", str(custom)]},
    )
    return cfg


def link_rule_table(recover_s: float) -> dict:
    """deviced's default faultCustomization.json with the 81078603 RecoverTimeout set to ``recover_s``."""
    table = json.loads(resources.files("deviced").joinpath("data/faultCustomization.json").read_text())
    for rule in table.get("FaultDuration", []):
        if "81078603" in rule.get("EventId", []):
            rule["RecoverTimeout"] = int(recover_s) if float(recover_s).is_integer() else recover_s
    return table


async def run(args: argparse.Namespace, clock: Clock, stack: Stack) -> int:
    """Run the scenario on ``stack`` (started here), print the summary; returns the exit status."""
    timing = Timing(
        detect_timeout_s=args.detect_timeout,
        link_down_s=args.link_down,
        link_recover_s=args.link_recover,
        slownode_round_s=args.slownode_round,
        slow_after_steps=args.slow_after_steps,
        slow_mode=args.slow_mode,
    )
    clock.say(f"faultmesh demo: run folder {stack.run_dir}")
    scenario = Scenario(stack, clock, timing)
    rows = scenario.rows  # filled as the steps run: an interrupted run still shows what it saw
    status = 1
    try:
        await stack.start()
        await scenario.run()
        dead = [c for c in stack.procs.dead()]
        if dead:
            clock.say(
                "processes that exited during the run: "
                + ", ".join(f"{c.name} ({c.proc.returncode})" for c in dead)
            )
        status = 0 if all_right(rows) else 1
    except StackError as e:
        clock.say(f"the stack did not start: {e}")
    except asyncio.CancelledError:
        clock.say("interrupted: stopping every process")
        status = 130
        for r in rows:
            if r.verdict == MISSING and r.detected is None:
                r.note = r.note or "interrupted before clusterd showed it"
    finally:
        where = where_text(stack)
        clock.say("stopping every process by PID")
        await asyncio.shield(stack.stop())
        clock.say(f"stopped {len(stack.procs.children)} processes")
    if rows:
        clock.print()
        clock.print("SUMMARY")
        clock.print(table(rows, clock))
    clock.print()
    clock.print(where)
    clock.print()
    verdict = {
        0: "every injected fault was detected and localized right",
        130: "interrupted",
    }.get(status, "NOT all faults were detected right")
    clock.say(f"demo finished in {time.time() - clock.t0:.0f} s: {verdict} (exit {status})")
    return status


def where_text(stack: Stack, demo: bool = True, job: bool = False) -> str:
    """Where the metrics, HTTP views and logs of ``stack`` are; ``demo=False`` for ``faultmesh up``
    (``job``: with ``--with-job``, the job's views too)."""
    head = (
        "WHERE TO LOOK (these addresses lived during the run; `faultmesh up` starts the same stack and keeps it)"
        if demo
        else "WHERE TO LOOK"
    )
    with_job = demo or job
    jobs = "/v1/jobs/demo-job/recovery  /v1/pingmesh  /v1/slownode/demo-job" if with_job else "/v1/pingmesh"
    lines = [
        head,
        f"  clusterd HTTP views : http://{stack.http}/v1/faults  /v1/nodes  /v1/nodes/<name>  /v1/jobs",
        f"                        {jobs}",
        *([f"  the job's web page  : http://{stack.http}/ui/job/demo-job"] if with_job else []),
        f"  clusterd metrics    : http://{stack.http}/metrics",
        f"  clusterd gRPC       : {stack.grpc}",
    ]
    for s in stack.servers:
        lines.append(
            f"  {s.name:<19} : deviced http://{s.deviced_http}/metrics (simulated NVIDIA GPUs)"
            if s.gpu
            else f"  {s.name:<19} : noded http://{s.noded_http}/metrics, deviced http://{s.deviced_http}/metrics,"
            f" bmc-sim control http://{s.bmc_control}/state"
        )
    lines.append(f"  log lines           : {stack.log_dir}/<process>.log (one file per process), e.g.")
    lines.append(f"                        grep 'recovery decision' {stack.log_dir}/clusterd.log")
    lines.append(
        f"                        grep 'FD-OL SLOWNODE' {stack.log_dir}/clusterd.log"
        f" {stack.log_dir}/noded-{stack.cfg.servers or 1}.log"
    )
    lines.append(f"                        grep 'slow network fault' {stack.log_dir}/clusterd.log")
    lines.append(f"  logs folder         : {stack.log_dir}" + (" (this output: demo.log)" if demo else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; Ctrl-C or SIGTERM stop every started process and exit 130."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.servers < 4 or args.npus < 8 or args.npus % 8:
        parser.error("the scenario needs --servers >= 4 and --npus a multiple of 8")
    clock = Clock()
    run_dir = Path(args.run_dir or f"/tmp/faultmesh-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        stack = Stack(demo_config(args, run_dir), run_dir, say=clock.say)
    except OSError as e:
        parser.error(f"--run-dir {run_dir}: {e.strerror or e}")
    clock.tee(stack.log_dir / "demo.log")  # the demo's own lines, next to every process's log

    async def _main() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await run(args, clock, stack)
        except asyncio.CancelledError:
            return 130
        finally:
            stack.procs.stop_all_now()  # a second Ctrl-C during the orderly stop: kill by PID

    return asyncio.run(_main())


if __name__ == "__main__":
    sys.exit(main())
