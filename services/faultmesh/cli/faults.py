"""``faultmesh faults`` and ``faultmesh nodes``: ClusterD's fault center and node view."""

from __future__ import annotations

import argparse
import time
import urllib.parse

from faultmesh.cli.common import add_server_flags, emit, http_json, run


def _ts(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


NAME_WIDTH = 32


def _short(name: str) -> str:
    """A fault name cut to :data:`NAME_WIDTH` characters for the table (JSON keeps it whole)."""
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


@run
def cmd_faults(args: argparse.Namespace) -> int:
    """Print the active faults (GET /v1/faults)."""
    q = {k: v for k, v in (("node", args.node), ("level", args.level), ("source", args.source)) if v}
    data = http_json(args, "GET", "/v1/faults" + ("?" + urllib.parse.urlencode(q) if q else ""))
    rows = [
        (
            f["node"],
            f["device_type"],
            f["device_id"],
            f["code"],
            _short(f.get("name", "")),
            f["level"],
            f["source"],
            _ts(f["first_seen_ms"]),
            _ts(f["last_seen_ms"]),
        )
        for f in data
    ]
    emit(
        args,
        data,
        rows,
        ("NODE", "DEVICE", "ID", "CODE", "NAME", "LEVEL", "SOURCE", "FIRST SEEN", "LAST SEEN"),
    )
    return 0


@run
def cmd_nodes(args: argparse.Namespace) -> int:
    """Print every known node with its health (GET /v1/nodes)."""
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
        )
        for n in data
    ]
    emit(args, data, rows, ("NODE", "HEALTH", "WORST LEVEL", "FAULTS", "AGENTS", "CONDITIONS", "DATA"))
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
    p.add_argument("--node")
    p.add_argument("--level")
    p.add_argument("--source")
    p.set_defaults(func=cmd_faults)
    p = sub.add_parser("nodes", help="list nodes and their health")
    add_server_flags(p)
    p.set_defaults(func=cmd_nodes)
