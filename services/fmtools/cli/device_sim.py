"""``faultmesh device-sim``: drive deviced's sim backend through its control API (deviced.simapi).

Examples (``--sim`` is the deviced ``--sim-control-addr``, env FAULTMESH_SIM_ADDR; ``--token-file``,
env FAULTMESH_TOKEN_FILE as on every other command: a file holding deviced's agent token, which its
HTTP ports then require for every change)::

    faultmesh device-sim devices
    faultmesh device-sim fault 3 80E18008 [--recover|--once] [--severity 2]
    faultmesh device-sim link 5 down|up
    faultmesh device-sim probe 5 3            # gateway probe result (0/6 healthy)
    faultmesh device-sim card 2 drop|back
    faultmesh device-sim procs 2 0
    faultmesh device-sim switch 0x00f1fef5 155914 npu --chip 0 --port 3 [--recover]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from fmtools.cli.common import emit, request_json, run, token


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    return request_json(
        args.sim, method, path, body, token(args), server="the deviced sim control API", what=path
    )


@run
def _devices(args):
    data = _call(args, "GET", "/sim/devices")
    rows = [
        (
            d["logic_id"],
            d["phy_id"],
            ",".join(d["codes"]),
            d["dropped"],
            d["network"],
            d["procs"],
            d["resets"],
        )
        for d in data
    ]
    emit(args, data, rows, ("LOGIC", "PHY", "CODES", "DROPPED", "PROBE", "PROCS", "RESETS"))


@run
def _post(args):
    body = args.body(args)
    emit(args, _call(args, "POST", args.path, body), [("ok",)], ("RESULT",))


def register(subparsers) -> None:
    """Add ``device-sim`` and its subcommands."""
    p = subparsers.add_parser("device-sim", help="drive deviced's simulated chips (sim backend)")
    p.add_argument(
        "--sim",
        default=os.environ.get("FAULTMESH_SIM_ADDR") or "127.0.0.1:8090",
        help="deviced --sim-control-addr (env FAULTMESH_SIM_ADDR)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("FAULTMESH_TOKEN_FILE"),
        help="file holding deviced's bearer token (env FAULTMESH_TOKEN_FILE)",
    )
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    sub = p.add_subparsers(dest="sim_command", metavar="ACTION")
    sub.required = True
    s = sub.add_parser("devices", help="list simulated chips")
    s.set_defaults(func=_devices)

    s = sub.add_parser("fault", help="inject a fault code on a chip")
    s.add_argument("device", type=int)
    s.add_argument("code", help="hex fault code, e.g. 80E18008")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--recover", action="store_true")
    g.add_argument("--once", action="store_true")
    s.add_argument("--severity", type=int, default=2)
    s.set_defaults(
        func=_post,
        path="/sim/fault",
        body=lambda a: {
            "device": a.device,
            "code": a.code,
            "severity": a.severity,
            "assertion": "recover" if a.recover else "once" if a.once else "occur",
        },
    )

    s = sub.add_parser("link", help="link down / up (81078603)")
    s.add_argument("device", type=int)
    s.add_argument("state", choices=("down", "up"))
    s.set_defaults(func=_post, path="/sim/link", body=lambda a: {"device": a.device, "state": a.state})

    s = sub.add_parser("probe", help="set the gateway-probe result")
    s.add_argument("device", type=int)
    s.add_argument("result", type=int)
    s.set_defaults(func=_post, path="/sim/probe", body=lambda a: {"device": a.device, "result": a.result})

    s = sub.add_parser("card", help="card drop / back (health -8012)")
    s.add_argument("device", type=int)
    s.add_argument("state", choices=("drop", "back"))
    s.set_defaults(func=_post, path="/sim/card", body=lambda a: {"device": a.device, "state": a.state})

    s = sub.add_parser("procs", help="set the process count on a chip")
    s.add_argument("device", type=int)
    s.add_argument("count", type=int)
    s.set_defaults(func=_post, path="/sim/procs", body=lambda a: {"device": a.device, "count": a.count})

    s = sub.add_parser("switch", help="raise or clear a lingqu switch fault")
    s.add_argument("alarm", help="alarm id, e.g. 0x00f1fef5")
    s.add_argument("fault_id", help="fault id or na")
    s.add_argument("peer", choices=("cpu", "npu", "L2", "na"))
    s.add_argument("--chip", type=int, default=0)
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--peer-port", type=int, default=0)
    s.add_argument("--recover", action="store_true")
    s.set_defaults(
        func=_post,
        path="/sim/switch",
        body=lambda a: {
            "alarm": a.alarm,
            "fault_id": a.fault_id,
            "peer": a.peer,
            "chip": a.chip,
            "port": a.port,
            "peer_port": a.peer_port,
            "assertion": "recover" if a.recover else "occur",
        },
    )
