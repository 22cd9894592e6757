"""``faultmesh history``: what happened, from ClusterD's fault history (GET /v1/events). The WHY
column is the server's ``why`` (:func:`clusterd.audit.why_of`: who released or acknowledged it and
why, the rule that raised it, else the source that reported it), the same words as the web view."""

from __future__ import annotations

import argparse
import time
import urllib.parse

from faultmesh.config import positive_int, since_arg
from fmtools.cli.common import add_server_flags, emit, http_json, run
from fmtools.cli.suggest import get_node


def _ts(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


def _device(e: dict) -> str:
    return e["device_type"] if e["device_id"] < 0 else f"{e['device_type']}-{e['device_id']}"


@run
def cmd_history(args: argparse.Namespace) -> int:
    """Print fault changes (occur / update / recover), oldest first. A ``--node`` with no change
    kept that clusterd does not know either is exit 4 (like ``faults --node``)."""
    q = {k: v for k, v in (("node", args.node), ("code", args.code), ("since", args.since)) if v}
    q["limit"] = str(args.limit)
    data = http_json(args, "GET", "/v1/events?" + urllib.parse.urlencode(q))
    if args.node and not data:  # nothing kept, or no such node: exit 4 like `faults --node`
        get_node(args, args.node)
    rows = [
        (
            _ts(e["ts_ms"]),
            e["kind"],
            e["node"],
            _device(e),
            e["code"],
            e["level"],
            e["source"],
            e.get("why", ""),
        )
        for e in data
    ]
    emit(args, data, rows, ("TIME", "CHANGE", "NODE", "DEVICE", "CODE", "LEVEL", "SOURCE", "WHY"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "history",
        help="what happened: every fault occur / update / recover kept by clusterd",
        description="Fault changes kept by clusterd (--history-retention-s, --history-max-rows), oldest first.",
    )
    add_server_flags(p)
    p.add_argument(
        "--node", help="only this node (exit 4 when clusterd has kept nothing of it and does not know it)"
    )
    p.add_argument("--code", help="only this fault code")
    p.add_argument(
        "--since",
        type=since_arg,
        help="a duration back from now (30m, 12h, 2d), an RFC 3339 time or epoch ms",
    )
    p.add_argument("--limit", type=positive_int, default=1000, help="the newest N changes (default 1000)")
    p.set_defaults(func=cmd_history)
