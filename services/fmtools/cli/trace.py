"""``faultmesh trace on|off|get NAMESPACE/JOB``: the data-trace (lightweight profiling) switch of a job.

``on`` switches all five domains on (heavy); ``on --light`` keeps CommunicationOperator off (what
FD-OL uses after a confirmed degradation); ``off`` switches everything off; ``--set KEY=VALUE``
sets single fields (the rest become "off"). Calls ``/TrainingDataTrace/*`` (clusterd.md §3).
"""

from __future__ import annotations

import argparse

from faultmesh._pb import profiling_pb2, profiling_pb2_grpc
from fmtools.cli._grpc import call
from fmtools.cli.common import Rejected, UsageError, add_server_flags, emit, run, server_error

FIELDS = ("CommunicationOperator", "Step", "SaveCheckpoint", "FP", "DataLoader")


def _ns_name(value: str) -> str:
    parts = value.split("/")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"job {value or '(none)'} is not NAMESPACE/JOB")
    return value


def switch_for(args: argparse.Namespace) -> dict[str, str]:
    """The five fields for the action and flags. Raises :class:`CliError` on a bad --set."""
    value = "on" if args.action == "on" else "off"
    sw = dict.fromkeys(FIELDS, value)
    if args.action == "on" and args.light:
        sw["CommunicationOperator"] = "off"
    for item in args.set or []:
        key, sep, val = item.partition("=")
        if not sep or key not in FIELDS or val not in ("on", "off"):
            raise UsageError(f"--set {item!r}: expected one of {', '.join(FIELDS)}=on|off")
        sw[key] = val
    return sw


@run
def cmd_trace(args: argparse.Namespace) -> int:
    """Set or show a job's data-trace switch."""
    name = _ns_name(args.job or args.job_pos or "")
    stub = profiling_pb2_grpc.TrainingDataTraceStub
    if args.action == "get":
        r = call(args, stub, "GetTrainingDataTraceSwitch", profiling_pb2.DataStatusReq(jobNsName=name))
        if r.code != 200:
            raise server_error(f"code {r.code}: {r.message}", Rejected)
        sw = {f: getattr(r.profilingSwitch, f) for f in FIELDS}
    else:
        sw = switch_for(args)
        req = profiling_pb2.DataTypeReq(jobNsName=name, profilingSwitch=profiling_pb2.ProfilingSwitch(**sw))
        r = call(args, stub, "ModifyTrainingDataTraceSwitch", req)
        if r.code != 200:
            raise server_error(f"code {r.code}: {r.message}", Rejected)
    emit(args, {"job": name, **sw}, [(name, *[sw[f] for f in FIELDS])], ("JOB", *FIELDS))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="switch a job's data trace (lightweight profiling) on/off, or show it")
    add_server_flags(p)
    p.add_argument("action", choices=("on", "off", "get"))
    p.add_argument("job_pos", nargs="?", metavar="NAMESPACE/JOB", help="the job; or --job")
    p.add_argument("--job", metavar="NAMESPACE/JOB", help="the job")
    p.add_argument("--light", action="store_true", help="with on: keep CommunicationOperator off")
    p.add_argument("--set", action="append", metavar="FIELD=on|off", help="set one field (repeatable)")
    p.set_defaults(func=cmd_trace)
