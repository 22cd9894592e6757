"""``faultmesh release npu NODE/PHY`` and ``faultmesh release node NODE``: an operator releases a
manually separated NPU, or every separated NPU of a node plus its stress-test isolation, through
clusterd's authenticated HTTP API (``POST /v1/release/npu`` / ``/v1/release/node``; the bearer token
from ``--token-file`` or ``FAULTMESH_TOKEN``). ``faultmesh release list`` shows the separated NPUs; ``faultmesh release breaker`` releases the
isolation circuit breaker (:mod:`clusterd.breaker`).
See :mod:`clusterd.separation`."""

from __future__ import annotations

import argparse
import getpass

from fmtools.cli.common import UsageError, add_server_flags, emit, http_json, run


def _npu(text: str) -> tuple[str, int]:
    node, sep, phy = text.rpartition("/")
    if not sep or not node or not phy.isdigit():
        raise UsageError(f"expected NODE/PHYID (e.g. node-3/5), got {text!r}")
    return node, int(phy)


def _released(args: argparse.Namespace, data) -> int:
    rows = [(r["node"], r["device_id"], r["code"], r.get("by", "")) for r in data["released"]]
    emit(args, data, rows, ("NODE", "ID", "RELEASED", "BY"))
    return 0


def _who(args: argparse.Namespace) -> dict[str, str]:
    """Who releases and why, as the history keeps it (``--by``, default the login name; ``--reason``)."""
    out = {"by": args.by or _login()}
    if args.reason:
        out["reason"] = args.reason
    return out


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        return "operator"


@run
def cmd_npu(args: argparse.Namespace) -> int:
    """Release one manually separated NPU (POST /v1/release/npu)."""
    node, phy = _npu(args.npu)
    body = {"node": node, "device_id": phy, **_who(args)}
    return _released(args, http_json(args, "POST", "/v1/release/npu", body))


@run
def cmd_node(args: argparse.Namespace) -> int:
    """Release a node's separated NPUs and its stress-test isolation (POST /v1/release/node)."""
    return _released(args, http_json(args, "POST", "/v1/release/node", {"node": args.node, **_who(args)}))


def _add_who(q: argparse.ArgumentParser) -> None:
    q.add_argument("--reason", help="why (kept in the fault history: faultmesh history, /v1/events)")
    q.add_argument("--by", help="who releases (default: your login name; kept in the history)")


@run
def cmd_breaker(args: argparse.Namespace) -> int:
    """Release the isolation circuit breaker (POST /v1/release/breaker): the nodes it held are
    isolated now. Check the faults first (``faultmesh faults``)."""
    data = http_json(args, "POST", "/v1/release/breaker", _who(args))
    rows = [(n, "held isolation released") for n in data["released"]]
    if not rows and not data["was_open"]:
        rows = [("-", "the breaker was not open")]
    emit(args, data, rows, ("NODE", "RESULT"))
    return 0


@run
def cmd_list(args: argparse.Namespace) -> int:
    """List the manually separated NPUs (GET /v1/separations)."""
    data = http_json(args, "GET", "/v1/separations")
    rows = [(s["node"], s["device_id"], ",".join(s["codes"])) for s in data]
    emit(args, data, rows, ("NODE", "ID", "CODES"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("release", help="release a manually separated NPU or an isolated node")
    rs = p.add_subparsers(dest="what", metavar="WHAT")
    rs.required = True
    q = rs.add_parser("npu", help="release one NPU: NODE/PHYID")
    add_server_flags(q)
    q.add_argument("npu", metavar="NODE/PHYID")
    _add_who(q)
    q.set_defaults(func=cmd_npu)
    q = rs.add_parser("node", help="release every separated NPU of NODE and its stress-test isolation")
    add_server_flags(q)
    q.add_argument("node", metavar="NODE")
    _add_who(q)
    q.set_defaults(func=cmd_node)
    q = rs.add_parser("breaker", help="release the isolation circuit breaker: the nodes it held are isolated")
    add_server_flags(q)
    _add_who(q)
    q.set_defaults(func=cmd_breaker)
    q = rs.add_parser("list", help="list the manually separated NPUs")
    add_server_flags(q)
    q.set_defaults(func=cmd_list)
