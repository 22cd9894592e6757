"""``faultmesh stress-test --job J --ops aic,p2p [--node N ...]``: online stress test (clusterd.md §4.2).

Without ``--node`` the ops run on every node of the job (``allNodesOps``). The command calls
``StressTest`` and then (unless ``--no-wait``) waits on ``SubscribeStressTestResponse`` for the
outcome. Exit status 1 unless the test finished clean.
"""

from __future__ import annotations

import argparse

from faultmesh._pb import recover_pb2
from faultmesh.cli._grpc import om_operation
from faultmesh.cli.common import UsageError, add_job_flag, add_server_flags, run

OPS = {"aic": 0, "p2p": 1, "0": 0, "1": 1}


def parse_ops(text: str) -> list[int]:
    """``aic,p2p`` -> [0, 1]. Raises :class:`CliError` on an unknown or repeated op."""
    ops = []
    for item in filter(None, (s.strip().lower() for s in text.split(","))):
        if item not in OPS:
            raise UsageError(f"--ops: unknown op {item!r} (aic/0, p2p/1)")
        ops.append(OPS[item])
    if not ops:
        raise UsageError("--ops is empty")
    if len(set(ops)) != len(ops):
        raise UsageError(f"--ops: {text!r} repeats an op")
    return ops


@run
def cmd_stress_test(args: argparse.Namespace) -> int:
    """Start a stress test and print its outcome."""
    ops = parse_ops(args.ops)
    if args.node:
        req = recover_pb2.StressTestParam(
            jobID=args.job_id, stressParam={n: recover_pb2.StressOpList(ops=ops) for n in args.node}
        )
    else:
        req = recover_pb2.StressTestParam(jobID=args.job_id, allNodesOps=ops)
    return om_operation(
        args,
        ("StressTest", req),
        ("SubscribeStressTestResponse", recover_pb2.StressTestRequest(jobID=args.job_id)),
        lambda msg: msg.startswith("stress test finish"),
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stress-test", help="run an online AIC/P2P stress test on a running job's NPUs")
    add_server_flags(p)
    add_job_flag(p, help="the running job's id")
    p.add_argument("--ops", default="aic", help="comma list of aic (0) and p2p (1)")
    p.add_argument("--node", action="append", help="test only these nodes (repeatable); default all")
    p.add_argument("--no-wait", action="store_true", help="do not wait for the outcome")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="wait at most this long for the outcome")
    p.set_defaults(func=cmd_stress_test)
