"""``faultmesh release npu NODE/PHY`` and ``faultmesh release node NODE``: an operator releases a
manually separated NPU, or every separated NPU of a node plus its stress-test isolation, through
clusterd's authenticated HTTP API (``POST /v1/release/npu`` / ``/v1/release/node``; the bearer token
from ``--token-file`` or ``FAULTMESH_TOKEN``). ``faultmesh release list`` shows the separated NPUs; ``faultmesh release breaker`` releases the
isolation circuit breaker (:mod:`clusterd.breaker`).
See :mod:`clusterd.separation`.

``faultmesh ack NODE CODE --reason WHY --for 2h [--device NPU-3]`` acknowledges a node's active
fault (every device with that code, or one), ``faultmesh unack NODE CODE`` ends it
(:mod:`clusterd.acks`: ``POST /v1/acks``, ``/v1/acks/remove``); both are operator actions with who
and why, so they live beside the releases."""

from __future__ import annotations

import argparse
import getpass
import time

from faultmesh.config import parse_duration_s
from fmtools.cli.common import NotFound, UsageError, add_server_flags, emit, http_json, run
from fmtools.cli.suggest import get_node

MAX_ACK_S = 7 * 86400  # clusterd.acks.MAX_FOR_S (the server checks it too)


def _npu(text: str) -> tuple[str, int]:
    node, sep, phy = text.rpartition("/")
    if not sep or not node or not phy.isdigit():
        raise UsageError(f"expected NODE/PHYID (e.g. node-3/5), got {text!r}")
    return node, int(phy)


def _released(args: argparse.Namespace, data) -> int:
    """The released rows: NODE, ID, RELEASED (the code), HELD BY (clusterd's policy or deviced's own
    rule held it), BY (the operator who released it, and the verified token's name)."""
    rows = [
        (
            r["node"],
            r["device_id"],
            r["code"],
            r.get("by", ""),
            _operator(r.get("released_by"), r.get("release_token")),
        )
        for r in data["released"]
    ]
    emit(args, data, rows, ("NODE", "ID", "RELEASED", "HELD BY", "BY"))
    return 0


def _operator(by: str | None, token: str | None) -> str:
    """``alice (token ops-alice)``; ``alice`` with no token checked; "" from an older clusterd."""
    return (by or "") + (f" (token {token})" if by and token else "")


def _release_call(args: argparse.Namespace, path: str, body: dict) -> dict:
    """POST a release; a 404 for a node clusterd has never seen says so with the closest names (exit
    4, :func:`fmtools.cli.suggest.get_node`), else the server's "nothing separated" stays."""
    try:
        return http_json(args, "POST", path, body)
    except NotFound:
        get_node(args, body["node"])  # raises "clusterd does not know node ... (did you mean ...?)"
        raise


def _who(args: argparse.Namespace) -> dict[str, str]:
    """Who acts and why, as the history keeps it (``--by``, default the login name: the claimed name
    beside the verified token's; ``--reason``)."""
    out = {"by": args.by or _login()}
    if args.reason is not None and not args.reason.strip() and args.command in ("release", "ack"):
        raise UsageError("--reason is empty: say why (it is kept in the fault history)")
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
    return _released(args, _release_call(args, "/v1/release/npu", body))


@run
def cmd_node(args: argparse.Namespace) -> int:
    """Release a node's separated NPUs and its stress-test isolation (POST /v1/release/node)."""
    return _released(args, _release_call(args, "/v1/release/node", {"node": args.node, **_who(args)}))


def _add_who(q: argparse.ArgumentParser) -> None:
    q.add_argument(
        "--reason",
        required=True,
        help="why (required; kept in the fault history: faultmesh history, /v1/events)",
    )
    q.add_argument(
        "--by", help="who releases (default: your login name; kept in the history beside the token's name)"
    )


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


def for_arg(text: str) -> float:
    """argparse type of ``--for``: a duration (2h, 30m, 1d) more than 0 and at most 7 days, in s."""
    try:
        v = parse_duration_s(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not 0 < v <= MAX_ACK_S:
        raise argparse.ArgumentTypeError(f"{text!r}: an acknowledgement lasts more than 0 s and at most 7d")
    return v


def _ack_body(args: argparse.Namespace) -> dict:
    """NODE CODE [--device], or --fault-id (exit 2 unless exactly one of them is given)."""
    if args.fault_id:
        if args.node or args.code or args.device:
            raise UsageError("give NODE CODE [--device] or --fault-id, not both")
        return {"fault_id": args.fault_id, **_who(args)}
    if not (args.node and args.code):
        raise UsageError("NODE and CODE are required (or --fault-id ID of a public fault)")
    return {"node": args.node, "code": args.code, "device": args.device or "", **_who(args)}


def _ack_call(args: argparse.Namespace, path: str, body: dict) -> dict:
    """POST ``body``; a 404 for a node clusterd has never seen says so with the closest names."""
    return _release_call(args, path, body) if args.node else http_json(args, "POST", path, body)


def ack_text(a: dict) -> str:
    """``alice (token ops-alice) until 2026-12-06 10:42:00: reason`` for a table cell (the claimed
    name, the verified token's name when one was checked)."""
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["until_ms"] / 1000))
    who = _operator(a["by"], a.get("token"))
    return f"{who} until {until}" + (f": {a['reason']}" if a.get("reason") else "")


@run
def cmd_ack(args: argparse.Namespace) -> int:
    """Acknowledge a node's active fault for ``--for`` with ``--reason`` (POST /v1/acks)."""
    data = _ack_call(args, "/v1/acks", {**_ack_body(args), "for_s": args.for_s})
    rows = [
        (a["node"], a["device"] or "*", a["code"], ack_text(a)) for a in data.get("acks") or [data["ack"]]
    ]
    emit(args, data, rows, ("NODE", "DEVICE", "CODE", "ACKNOWLEDGED"))
    return 0


@run
def cmd_unack(args: argparse.Namespace) -> int:
    """End an acknowledgement before its time (POST /v1/acks/remove)."""
    data = _ack_call(args, "/v1/acks/remove", _ack_body(args))
    rows = [(a["node"], a["device"] or "*", a["code"], "acknowledgement removed")
            for a in data.get("all_removed") or [data["removed"]]]  # fmt: skip
    emit(args, data, rows, ("NODE", "DEVICE", "CODE", "RESULT"))
    return 0


def _register_ack(sub: argparse._SubParsersAction) -> None:
    for name, fn, help_ in (
        ("ack", cmd_ack, "acknowledge an active fault: alerts may leave it out until --for ends"),
        ("unack", cmd_unack, "end an acknowledgement before its time"),
    ):
        q = sub.add_parser(name, help=help_, description=help_ + " (the fault keeps its level and recovery)")
        add_server_flags(q)
        q.add_argument("node", metavar="NODE", nargs="?")
        q.add_argument(
            "code", metavar="CODE", nargs="?", help="the fault code (faultmesh faults --node NODE)"
        )
        q.add_argument("--device", help="only this device (NPU-3, Node; default: every device with CODE)")
        q.add_argument("--fault-id", help="instead of NODE CODE: every active fault of this public fault id")
        q.add_argument("--by", help="who (default: your login name; kept in the history)")
        if name == "ack":
            q.add_argument(
                "--reason", required=True, help="why (required; shown with the fault and in the history)"
            )
            q.add_argument("--for", dest="for_s", type=for_arg, required=True, metavar="DURATION",
                           help="how long: 30m, 2h, 1d (at most 7d); it ends by itself then")  # fmt: skip
        else:
            q.add_argument("--reason", help="why (kept in the history)")
        q.set_defaults(func=fn)


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
    _register_ack(sub)
