"""``faultmesh pingmesh status``: per super pod, the latest pingmesh matrix summary and open alarms
(ClusterD ``GET /v1/pingmesh``, issue 6)."""

from __future__ import annotations

import argparse
import sys
import time

from fmtools.cli.common import EXIT_FAILED, add_server_flags, emit, http_json, print_table, run, structured


def _ts(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else ""


def _where(a: dict) -> str:
    if a["kind"] == "plane":
        return f"plane {a['plane']} ({','.join(a['nodes'])})"
    if a["kind"] == "node":
        return a["node"]
    where = f"{a['node']}/npu{a['phyId']}"
    if a["kind"] == "link":
        where += f" <-> {a['peerNode']}/npu{a['peerPhyId']}"
    return where


@run
def cmd_status(args: argparse.Namespace) -> int:
    """Print the pingmesh status; exit status 0 (no open alarm), 3 (alarms open)."""
    path = f"/v1/pingmesh/{args.super_pod}" if args.super_pod else "/v1/pingmesh"
    data = http_json(args, "GET", path)
    pods = [data] if args.super_pod else data["superPods"]
    rows = []
    for p in pods:
        latest = p.get("latest") or {}
        rows.append(
            (
                p["superPodId"],
                "on" if p["activate"] else "off",
                p["periodMs"] / 1000,
                f"{len(p['nodesConnected'])}/{p['nodes']}",
                p["paths"],
                latest.get("pathsWithData", 0),
                latest.get("faultyPaths", 0),
                latest.get("avgLossRate"),
                latest.get("avgDelay"),
                len(p["alarms"]) + len(p["unreachableCards"]),
                _ts(p.get("lastAnalysisMs")),
            )
        )
    alarms = [(p["superPodId"], a) for p in pods for a in p["alarms"]]
    cards = [(p["superPodId"], c) for p in pods for c in p["unreachableCards"]]
    if structured(args):
        emit(args, data, [], ())
    else:
        print_table(
            rows,
            ("SUPER POD", "ACTIVE", "PERIOD S", "NODES", "PATHS", "WITH DATA", "FAULTY", "AVG LOSS %", "AVG DELAY",
             "ALARMS", "LAST ANALYSIS"),
        )  # fmt: skip
        if alarms or cards:
            sys.stdout.write("\n")
            arows = [
                (
                    sp,
                    a["code"],
                    a["kind"],
                    _where(a),
                    a["faultTypeName"],
                    a["avgLossRate"],
                    a["avgDelay"],
                    _ts(a["firstSeenMs"]),
                )
                for sp, a in alarms
            ]
            arows += [(sp, "220001001", "card", f"{c['node']}/npu{c['phyId']}", "unreachable", 100.0, -1, _ts(c["firstSeenMs"]))
                      for sp, c in cards]  # fmt: skip
            print_table(arows, ("SUPER POD", "CODE", "KIND", "WHERE", "TYPE", "LOSS %", "DELAY", "SINCE"))
    return EXIT_FAILED if alarms or cards else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``faultmesh pingmesh status``."""
    p = sub.add_parser("pingmesh", help="HCCS pingmesh / slow-network status")
    psub = p.add_subparsers(dest="pingmesh_command", metavar="SUBCOMMAND")
    psub.required = True
    s = psub.add_parser("status", help="latest matrix summary and open alarms per super pod")
    add_server_flags(s)
    s.add_argument("--super-pod", help="only this super pod id")
    s.set_defaults(func=cmd_status)
