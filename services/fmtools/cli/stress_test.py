"""``faultmesh stress-test --job J --ops aic,p2p [--node N ...]``: online stress test (clusterd.md §4.2).

Without ``--node`` the ops run on every node of the job (``allNodesOps``). The command calls
``StressTest`` and then (unless ``--no-wait``) waits on ``SubscribeStressTestResponse`` for the
outcome, with a live progress line on stderr. The outcome is printed as its summary and a table of
every op on every NPU: node, device, op, code and what the code means (the reference's
StressTestOpResult codes, taskd API doc "ReplyStressTestResult"). Exit status 1 unless the test
finished clean.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse

from faultmesh._pb import recover_pb2
from faultmesh.config import positive_float
from fmtools.cli._grpc import om_operation
from fmtools.cli.common import CliError, NotFound, UsageError, add_job_flag, add_server_flags, http_json, run
from fmtools.cli.suggest import did_you_mean

OPS = {"aic": 0, "p2p": 1, "0": 0, "1": 1}
OP_NAMES = {"0": "aic", "1": "p2p"}
CODE_MEANINGS = {
    "0": "ok, no fault",
    "1": "test failed; training can go on",
    "2": "fault found: the node is isolated",
    "3": "timed out: the node's ranks restart",
    "4": "voltage not recovered: the node's ranks restart",
}
RESULT_HEADERS = ("NODE", "DEVICE", "OP", "CODE", "MEANING", "DETAIL")


def result_rows(msg: str) -> tuple[str, list[tuple[str, str, str, str, str, str]]]:
    """clusterd's outcome text -> (summary, rows).

    ``msg``: ``<summary>,result:{node: {device: {"rankResult": {op: {"code", "result"}}}}}`` (the
    O&M reply of clusterd.md §4.2; a result without the ``rankResult`` level is read too). Rows are
    (node, device, op name, code, meaning, detail), sorted; a message without a readable result
    gives ``(msg, [])``.
    """
    head, sep, body = msg.partition("result:")
    if not sep:
        return msg, []
    try:
        res = json.loads(body)
        rows = []
        for node, devs in sorted(res.items()):
            for dev, r in sorted(devs.items(), key=lambda kv: (len(kv[0]), kv[0])):
                for op, out in sorted(r.get("rankResult", r).items()):
                    code = str(out.get("code", ""))
                    meaning = CODE_MEANINGS.get(code, f"code {code!r} (not in the reference's table)")
                    rows.append((node, dev, OP_NAMES.get(op, op), code, meaning, str(out.get("result", ""))))
    except (ValueError, AttributeError, TypeError):
        return msg, []
    return head.strip().rstrip(","), rows


def finished_clean(msg: str) -> bool:
    """True when clusterd's outcome ``msg`` says the test finished (``stress test finish``) and no op
    on any NPU answered other than "0". The reference also answers "finish" when ops failed with
    code "1" (test failed, training goes on); the command exits 1 then, as a failed test."""
    return msg.startswith("stress test finish") and all(row[3] == "0" for row in result_rows(msg)[1])


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

    def details(msg: str, ok: bool):
        summary, rows = result_rows(msg)
        return summary, rows, RESULT_HEADERS

    try:
        return om_operation(
            args,
            "stress-test",
            ("StressTest", req),
            ("SubscribeStressTestResponse", recover_pb2.StressTestRequest(jobID=args.job_id)),
            finished_clean,
            details,
        )
    except NotFound as e:
        if args.node and "not exist in job" in str(e):
            raise NotFound(f"{e}{_job_nodes_hint(args)}") from None
        raise


def _job_nodes_hint(args: argparse.Namespace) -> str:
    """``; node 'nod-a' is not one of the job's (did you mean 'node-a'?)`` for each ``--node`` the
    job has no rank on (its ranks from GET /v1/jobs/<id>, the did-you-mean ``pubfault send`` uses);
    "" when clusterd's HTTP API cannot tell (the server's refusal stands alone then)."""
    try:
        job = http_json(args, "GET", "/v1/jobs/" + urllib.parse.quote(args.job_id, safe=""))
        nodes = sorted({r["node"] for r in job.get("ranks") or []})
    except (CliError, AttributeError, KeyError, TypeError):
        return ""
    return "".join(
        f"; node {n!r} is not one of the job's{did_you_mean(n, nodes)}" for n in args.node if n not in nodes
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stress-test", help="run an online AIC/P2P stress test on a running job's NPUs")
    add_server_flags(p)
    add_job_flag(p, help="the running job's id")
    p.add_argument("--ops", default="aic", help="comma list of aic (0) and p2p (1)")
    p.add_argument("--node", action="append", help="test only these nodes (repeatable); default all")
    p.add_argument("--no-wait", action="store_true", help="do not wait for the outcome")
    p.add_argument(
        "--timeout-s", type=positive_float, default=3600.0, help="wait at most this long for the outcome"
    )
    p.set_defaults(func=cmd_stress_test)
