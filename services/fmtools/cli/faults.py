"""``faultmesh faults`` and ``faultmesh nodes``: ClusterD's fault center and node view."""

from __future__ import annotations

import argparse
import time
import urllib.parse

from faultmesh.levels import KNOWN_LEVELS
from fmtools.cli.common import add_server_flags, emit, http_json, run
from fmtools.cli.release import ack_text
from fmtools.cli.suggest import get_node, level_arg


def _ts(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


NAME_WIDTH = 32


def short(name: str, width: int = NAME_WIDTH) -> str:
    """A fault name in at most ``width`` characters for the table, cut after a whole word and marked
    ``…`` (issue 31: names were cut mid-word); a first word longer than half the width is cut
    within it. ``-o wide``, JSON and YAML keep the name whole."""
    if len(name) <= width:
        return name
    cut = name[: width - 1]
    space = cut.rfind(" ") if name[width - 1] != " " else width - 1
    if space >= width // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:(-") + "…"


@run
def cmd_faults(args: argparse.Namespace) -> int:
    """Print the active faults (GET /v1/faults); a ``--node`` clusterd does not know is exit 4."""
    q = {k: v for k, v in (("node", args.node), ("level", args.level), ("source", args.source)) if v}
    data = http_json(args, "GET", "/v1/faults" + ("?" + urllib.parse.urlencode(q) if q else ""))
    if args.node and not data:  # no faults, or no such node: GET /v1/nodes/<name> tells (404: exit 4)
        get_node(args, args.node)
    rows = [
        (
            f["node"],
            f.get("device_kind") or f["device_type"],
            f["device_id"],
            f["code"],
            f.get("name", "") if args.output == "wide" else short(f.get("name", "")),
            f["level"],
            f["source"],
            _ts(f["first_seen_ms"]),
            _ts(f["last_seen_ms"]),
            ack_text(f["ack"]) if f.get("ack") else "",
            f["assertion"],
            ",".join(f"{k}={v}" for k, v in sorted(f["attributes"].items())),
        )
        for f in data
    ]
    headers = (
        "NODE",
        "DEVICE",
        "ID",
        "CODE",
        "NAME",
        "LEVEL",
        "SOURCE",
        "FIRST SEEN",
        "LAST SEEN",
        "ACKNOWLEDGED",
        "ASSERTION",
        "ATTRIBUTES",
    )
    emit(args, data, rows, headers, wide=2)
    return 0


@run
def cmd_nodes(args: argparse.Namespace) -> int:
    """Print every known node with its health (GET /v1/nodes), or only ``--node`` (GET
    /v1/nodes/<name>; one clusterd does not know is exit 4)."""
    if args.node:
        one = get_node(args, args.node)
        data = [{k: v for k, v in one.items() if k not in ("fault_list", "devices")}]
    else:
        data = http_json(args, "GET", "/v1/nodes")
    rows = [
        (
            n["name"],
            n["health"],
            n["worst_level"],
            n["faults"],
            ",".join(n["agents"]),
            ",".join(c["type"] for c in n["conditions"]),
            _data_state(n),
            n["node_ip"],
            n["node_status"],
        )
        for n in data
    ]
    headers = (
        "NODE",
        "HEALTH",
        "WORST LEVEL",
        "FAULTS",
        "AGENTS",
        "CONDITIONS",
        "DATA",
        "NODE IP",
        "REPORTED STATUS",
    )
    emit(args, data, rows, headers, wide=2)
    return 0


def _data_state(n: dict) -> str:
    """``current``, or ``stale:<agents>`` / ``pending:<agent/source>`` (issue 20)."""
    parts = []
    if n.get("stale_agents"):
        parts.append("stale:" + ",".join(n["stale_agents"]))
    if n.get("pending_sources"):
        parts.append("pending:" + ",".join(n["pending_sources"]))
    return " ".join(parts) or "current"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("faults", help="list the active faults of the cluster")
    add_server_flags(p)
    p.add_argument("--node", help="only this node")
    p.add_argument(
        "--level", type=level_arg, metavar="LEVEL", help=f"only this level: {', '.join(sorted(KNOWN_LEVELS))}"
    )
    p.add_argument("--source", help="only this source (deviced, noded, public, fd-online, ...)")
    p.set_defaults(func=cmd_faults)
    p = sub.add_parser("nodes", help="list nodes and their health")
    add_server_flags(p)
    p.add_argument("--node", help="only this node (exit 4 when clusterd does not know it)")
    p.set_defaults(func=cmd_nodes)
