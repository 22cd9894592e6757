"""``faultmesh trainsim``: play TaskD / MindIO of one job against ClusterD (see :mod:`fmtools.trainsim`).

Prints one JSON line per event (init, register, signal, reply, switch, stress, stream-ended, and
client-error where the real TaskD / MindIO would break on what clusterd sent) on stdout. Examples::

    faultmesh trainsim --job JOB                       # answers everything with success
    faultmesh trainsim --job JOB --strategies recover,dump --status recover=406
    faultmesh trainsim --job JOB --switch fail         # NIC switch fails -> normal recovery
    faultmesh trainsim --job JOB --stress-code 2       # stress test finds a fault: node isolated
    faultmesh trainsim --job JOB --stop silent         # never confirms a pause (timeout path)
    faultmesh trainsim --job JOB --ranks-per-pod 8     # also check globalFault names whole pods
    faultmesh trainsim --job JOB --grpc 10.0.0.10:8899 --grpc-tls-ca ca.pem   # another host, TLS
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import grpc

from faultmesh.agentconf import BACKOFF_MAX_LIMIT_S, BACKOFF_MIN_S
from faultmesh.config import number_in
from fmtools.cli._grpc import credentials, options
from fmtools.cli.common import (
    Unreachable,
    UsageError,
    add_job_flag,
    add_server_flags,
    run,
    server_error,
    token,
)
from fmtools.trainsim import SILENT, Outcomes, TrainSim, TrainSimError


def _status_map(text: str) -> tuple[dict[str, int | str], int | str]:
    """``recover=0,retry=405,dump=silent,default=0`` -> ({strategy: code}, default)."""
    out: dict[str, int | str] = {}
    default: int | str = 0
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--status: {item!r} is not strategy=code")
        if value != SILENT:
            try:
                value = int(value)
            except ValueError:
                raise UsageError(f"--status: code {value!r} must be an integer or silent") from None
        if key == "default":
            default = value
        else:
            out[key] = value
    return out, default


def _rank_codes(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        rank, sep, code = item.partition("=")
        if not sep or not rank.isdigit() or code not in ("0", "1", "2", "3", "4", SILENT):
            raise UsageError(f"--stress-rank-code: {item!r} is not rank=code (code 0..4)")
        out[rank] = code
    return out


def outcomes_from_args(args: argparse.Namespace) -> Outcomes:
    """Build :class:`Outcomes` from the CLI flags. Raises :class:`CliError` on a bad value."""
    status, default = _status_map(args.status)
    strategies = None if args.strategies == SILENT else [s for s in args.strategies.split(",") if s]
    return Outcomes(
        stop=args.stop,
        strategies=strategies,
        status=status,
        default_status=default,
        switch=args.switch,
        stress_code=args.stress_code,
        stress_codes=_rank_codes(args.stress_rank_code),
        delay_s=args.delay_s,
        exit_on_kill=args.exit_on_kill,
        process_fault=args.process_fault,
        mindio_wait_s=args.mindio_wait_s,
    )


@run
def cmd_trainsim(args: argparse.Namespace) -> int:
    """Run the simulator until SIGINT/SIGTERM, ``--duration-s`` or (with --exit-on-kill) killMaster."""
    outcomes = outcomes_from_args(args)

    def emit(ev: dict) -> None:
        if ev["event"] == "keep-alive" and not args.verbose:
            return
        sys.stdout.write(json.dumps(ev, sort_keys=True) + "\n")
        sys.stdout.flush()

    async def main() -> int:
        sim = TrainSim(
            args.grpc,
            args.job_id,
            outcomes,
            role=args.role,
            token=token(args),
            on_event=emit,
            reconnect=not args.no_reconnect,
            ranks_per_pod=args.ranks_per_pod,
            credentials=credentials(args),
            channel_options=options(args),
            backoff_max_s=args.reconnect_backoff_max,
        )
        loop = asyncio.get_running_loop()
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, sim.stop)
        if args.duration_s:
            loop.call_later(args.duration_s, sim.stop)
        try:
            await sim.connect()
        except TrainSimError as e:
            raise server_error(str(e)) from None
        except grpc.aio.AioRpcError as e:
            raise Unreachable(
                f"cannot reach clusterd at {args.grpc}: {e.code().name}: {e.details()}"
            ) from None
        await sim.run()
        return 0

    return asyncio.run(main())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trainsim", help="simulate TaskD/MindIO of one job (answers recovery, NIC switch, stress test)"
    )
    add_server_flags(p)
    add_job_flag(p, help="the job's id (UID)")
    p.add_argument("--role", default="taskd")
    p.add_argument(
        "--stop", choices=("ok", "fail", "notready", SILENT), default="ok", help="answer to stopTrain/pause"
    )
    p.add_argument(
        "--strategies",
        default="retry,recover,dump,exit",
        help="strategies reported after globalFault / new pod running (comma list, or silent)",
    )
    p.add_argument(
        "--status",
        default="",
        help="ReportRecoverStatus codes per strategy, e.g. recover=406,retry=405,continue=0,dump=silent,default=0",
    )
    p.add_argument("--switch", choices=("ok", "fail", SILENT), default="ok", help="NIC switch result")
    p.add_argument(
        "--stress-code", choices=("0", "1", "2", "3", "4", SILENT), default="0", help="stress test op code"
    )
    p.add_argument("--stress-rank-code", default="", help="per-rank stress codes, e.g. 2=2,3=3")
    p.add_argument(
        "--process-fault",
        choices=("ok", SILENT),
        default="ok",
        help="answer preExitProcess with ReportProcessFault (ok) or never (silent)",
    )
    p.add_argument(
        "--ranks-per-pod",
        type=int,
        default=0,
        help="NPUs per pod: check that globalFault names every rank of an exiting pod (0: skip)",
    )
    p.add_argument("--delay-s", type=float, default=0.0, help="wait before every answer (s)")
    p.add_argument(
        "--mindio-wait-s",
        type=float,
        default=0.0,
        help="MINDIO_WAIT_MINDX_TIME: an error when no changeStrategy follows the stop in time (0: off)",
    )
    p.add_argument("--exit-on-kill", action="store_true", help="stop when killMaster arrives")
    p.add_argument(
        "--duration-s", type=float, default=0.0, help="stop after this many seconds (0 = run until signal)"
    )
    p.add_argument(
        "--no-reconnect",
        action="store_true",
        help="exit when the stream is lost (default: Init/Register again)",
    )
    p.add_argument(
        "--reconnect-backoff-max",
        type=number_in(float, BACKOFF_MIN_S, BACKOFF_MAX_LIMIT_S),
        default=5.0,
        help="longest wait between reconnects to ClusterD (s, default 5)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also print keep-alive signals")
    p.set_defaults(func=cmd_trainsim)
