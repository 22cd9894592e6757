"""``faultmesh switch-nic --job J --nic NODE:DEV=on|off ...``: NIC fail-over / switch-back (clusterd.md §4.1).

``on`` switches the device's traffic to the backup NIC, ``off`` switches it back. The command calls
``SwitchNicTrack`` and then (unless ``--no-wait``) waits on ``SubscribeSwitchNicSignal`` for the
one outcome message (e.g. ``switch nic finish``), with a live progress line on stderr, and prints
the outcome and a table of the switched NICs. Exit status 1 unless the switch finished.
"""

from __future__ import annotations

import argparse

from faultmesh._pb import recover_pb2
from faultmesh.config import positive_float
from fmtools.cli._grpc import om_operation
from fmtools.cli.common import UsageError, add_job_flag, add_server_flags, run


def parse_nics(items: list[str]) -> dict[str, tuple[list[str], list[bool]]]:
    """``["node-b:0=on", "node-b:1=off"]`` -> {node: ([dev], [op])}. Raises :class:`UsageError`."""
    out: dict[str, tuple[list[str], list[bool]]] = {}
    for item in items:
        node, sep, rest = item.partition(":")
        dev, sep2, op = rest.partition("=")
        if not sep or not sep2 or not node or not dev.isdigit() or op not in ("on", "off"):
            raise UsageError(f"--nic {item!r}: expected NODE:DEVICE=on|off (e.g. node-b:0=on)")
        devs, ops = out.setdefault(node, ([], []))
        devs.append(dev)
        ops.append(op == "on")
    return out


@run
def cmd_switch_nic(args: argparse.Namespace) -> int:
    """Start a NIC switch and print its outcome."""
    nics = parse_nics(args.nic)
    req = recover_pb2.SwitchNics(
        jobID=args.job_id, nicOps={n: recover_pb2.DeviceList(dev=d, op=o) for n, (d, o) in nics.items()}
    )

    def details(msg: str, ok: bool):
        done = "requested" if args.no_wait else ("done" if ok else "failed")
        rows = [
            (node, dev, "to the backup NIC" if on else "back to the primary NIC", done)
            for node, (devs, ops) in sorted(nics.items())
            for dev, on in zip(devs, ops, strict=True)
        ]
        return msg, rows, ("NODE", "DEVICE", "SWITCH", "RESULT")

    return om_operation(
        args,
        "switch-nic",
        ("SwitchNicTrack", req),
        ("SubscribeSwitchNicSignal", recover_pb2.SwitchNicRequest(jobID=args.job_id)),
        lambda msg: msg == "switch nic finish",
        details,
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("switch-nic", help="switch NPU NICs of a running job to/from their backup")
    add_server_flags(p)
    add_job_flag(p, help="the running job's id")
    p.add_argument("--nic", action="append", required=True, metavar="NODE:DEV=on|off", help="repeatable")
    p.add_argument("--no-wait", action="store_true", help="do not wait for the outcome")
    p.add_argument(
        "--timeout-s", type=positive_float, default=3600.0, help="wait at most this long for the outcome"
    )
    p.set_defaults(func=cmd_switch_nic)
