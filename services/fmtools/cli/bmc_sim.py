"""``faultmesh bmc-sim``: run the BMC simulator, and drive it at run time.

- ``faultmesh bmc-sim --port P --user U --password-file F [--control-port C] [--alarms N]`` serves
  an IPMI 2.0 lanplus BMC on 127.0.0.1:P (UDP) and its control API on 127.0.0.1:C (TCP);
  ``--address`` / ``--control-address`` bind them elsewhere (another host's noded, multi-host tests).
- ``faultmesh bmc-sim inject --control 127.0.0.1:C --code 0800004B --device-type 'PCIe Card' --device-id 3``
  adds an iBMC alarm; ``--sel memory-ecc`` (or ``--sensor-type/--offset``) appends a SEL event.
- ``faultmesh bmc-sim clear --control ... [--code X] [--sel]`` removes alarms or clears the SEL.
- ``faultmesh bmc-sim status --control ...`` prints the simulator state; ``behave`` sets delay/drop/
  OEM reply mode for bad-BMC tests.

See :mod:`fmtools.sims.bmc` for the protocol details.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from faultmesh.config import bool_arg, non_negative_float
from faultmesh.log import add_log_arguments
from fmtools.cli.common import CliError, request_json, run

# Named SEL events for ``inject --sel NAME``: (sensor type, event type, offset), IPMI 2.0 table 42-3.
SEL_EVENTS = {
    "memory-ecc": (0x0C, 0x6F, 0x01),
    "memory-correctable-ecc": (0x0C, 0x6F, 0x00),
    "cpu-ierr": (0x07, 0x6F, 0x00),
    "cpu-mce": (0x07, 0x6F, 0x0B),
    "psu-failure": (0x08, 0x6F, 0x01),
    "fan-failure": (0x04, 0x01, 0x02),
    "temperature-critical": (0x01, 0x01, 0x09),
    "drive-fault": (0x0D, 0x6F, 0x01),
}


def _post(control: str, path: str, body: dict, timeout_s: float = 5.0) -> dict:
    return request_json(control, "POST", path, body, None, timeout_s, "bmc-sim control API", "bmc-sim", {})


def _get(control: str, path: str, timeout_s: float = 5.0) -> dict:
    return request_json(control, "GET", path, None, None, timeout_s, "bmc-sim control API", "bmc-sim", {})


@run
def cmd_serve(args: argparse.Namespace) -> int:
    """Run the simulator in the foreground until killed."""
    from faultmesh.config import read_secret
    from faultmesh.log import setup_from_args
    from fmtools.sims.bmc import serve

    if args.port is None:
        raise CliError("bmc-sim needs --port (0 picks a free port)")
    try:
        password = read_secret(args.password_file, "FAULTMESH_BMC_PASSWORD", "--password-file")
    except OSError as e:
        raise CliError(str(e)) from None
    if not password:
        raise CliError("bmc-sim needs --password-file or env FAULTMESH_BMC_PASSWORD")
    setup_from_args(args)
    try:
        serve(
            args.port,
            args.user,
            password,
            args.control_port,
            args.address,
            args.alarms,
            serial=args.serial,
            control_address=args.control_address,
        )
    except OSError as e:
        raise CliError(f"cannot bind: {e}") from None
    return 0


def _int(v: str) -> int:
    return int(v, 0)


@run
def cmd_inject(args: argparse.Namespace) -> int:
    """Add alarms (``--code``) or a SEL event (``--sel`` / ``--sensor-type``)."""
    if args.sel or args.sensor_type is not None:
        if args.sel:
            st, et, off = SEL_EVENTS[args.sel]
        else:
            if args.offset is None:
                raise CliError("--sensor-type needs --offset")
            st, et, off = args.sensor_type, args.event_type, args.offset
        body = {
            "sensor_type": st,
            "event_type": et,
            "offset": off,
            "sensor_num": args.sensor_num,
            "deassert": args.deassert,
        }
        out = _post(args.control, "/sel", body)
    elif args.code:
        body = {
            "code": args.code,
            "device_type": args.device_type,
            "device_id": args.device_id,
            "severity": args.severity,
            "count": args.count,
        }
        out = _post(args.control, "/alarms", body)
    else:
        raise CliError("inject needs --code (alarm) or --sel/--sensor-type (SEL event)")
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


@run
def cmd_clear(args: argparse.Namespace) -> int:
    """Remove alarms (all, or matching ``--code/--device-type/--device-id``) or clear the SEL."""
    if args.sel:
        out = _post(args.control, "/sel/clear", {})
    else:
        body = {
            k: v
            for k, v in (
                ("code", args.code),
                ("device_type", args.device_type),
                ("device_id", args.device_id),
            )
            if v is not None
        }
        out = _post(args.control, "/alarms/clear", body)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


@run
def cmd_status(args: argparse.Namespace) -> int:
    """Print the simulator state as JSON."""
    sys.stdout.write(json.dumps(_get(args.control, "/state"), indent=2) + "\n")
    return 0


@run
def cmd_behave(args: argparse.Namespace) -> int:
    """Set reply delay, dropping, OEM reply mode."""
    body = {
        k: v for k, v in (("delay_s", args.delay), ("drop", args.drop), ("oem", args.oem)) if v is not None
    }
    sys.stdout.write(json.dumps(_post(args.control, "/behaviour", body)) + "\n")
    return 0


def register(subparsers) -> None:
    """Add ``bmc-sim`` (serve) with the ``inject``, ``clear``, ``status`` and ``behave`` verbs."""
    # allow_abbrev=False: the verbs' --control must not read as a prefix of --control-port/-address
    p = subparsers.add_parser(
        "bmc-sim", help="IPMI BMC simulator (Huawei OEM alarms, SEL) for noded", allow_abbrev=False
    )
    p.add_argument("--port", type=int, default=None, help="UDP port to serve IPMI on (0 = any free port)")
    p.add_argument("--address", default="127.0.0.1", help="address IPMI (UDP) listens on")
    p.add_argument("--user", default=os.environ.get("FAULTMESH_BMC_USER", "admin"))
    p.add_argument(
        "--password-file",
        default=os.environ.get("FAULTMESH_BMC_PASSWORD_FILE"),
        help="file holding the password (or env FAULTMESH_BMC_PASSWORD)",
    )
    p.add_argument("--control-port", type=int, default=0, help="TCP port of the control API")
    p.add_argument(
        "--control-address",
        default="127.0.0.1",
        help="address the control API listens on (it has no authentication: beyond loopback only on a lab "
        "network, e.g. to inject from another host)",
    )
    p.add_argument("--alarms", type=int, default=0, help="start with this many alarms (bench)")
    p.add_argument("--serial", default="", help="serial number answered to OEM 0x30 0x90")
    add_log_arguments(p, file_help="also log to this file")
    p.set_defaults(func=cmd_serve)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")

    def control(sp):
        sp.add_argument("--control", required=True, help="control API address host:port")

    inj = verbs.add_parser("inject", help="add an iBMC alarm or a SEL event")
    control(inj)
    inj.add_argument("--code", help="alarm code, 8 hex digits (e.g. 0800004B)")
    inj.add_argument("--device-type", default="System", help="device type name or byte (Memory, 0x01)")
    inj.add_argument("--device-id", type=int, default=0)
    inj.add_argument("--severity", type=int, default=2)
    inj.add_argument("--count", type=int, default=1, help="add N alarms (code+i, device-id+i)")
    inj.add_argument("--sel", choices=sorted(SEL_EVENTS), help="append a named SEL event")
    inj.add_argument("--sensor-type", type=_int, help="SEL event sensor type (e.g. 0x0c)")
    inj.add_argument("--event-type", type=_int, default=0x6F, help="event/reading type (default 0x6f)")
    inj.add_argument("--offset", type=_int, help="event offset")
    inj.add_argument("--sensor-num", type=_int, default=0)
    inj.add_argument("--deassert", action="store_true", help="a deassertion event (recovers the fault)")
    inj.set_defaults(func=cmd_inject)

    clr = verbs.add_parser("clear", help="remove alarms or clear the SEL")
    control(clr)
    clr.add_argument("--code")
    clr.add_argument("--device-type")
    clr.add_argument("--device-id", type=int)
    clr.add_argument("--sel", action="store_true", help="clear the SEL instead of alarms")
    clr.set_defaults(func=cmd_clear)

    sts = verbs.add_parser("status", help="print the simulator state")
    control(sts)
    sts.set_defaults(func=cmd_status)

    beh = verbs.add_parser("behave", help="make the BMC slow, silent or answer badly")
    control(beh)
    beh.add_argument("--delay", type=non_negative_float, help="seconds before each reply")
    beh.add_argument("--drop", type=bool_arg, help="true: never answer")
    beh.add_argument("--oem", choices=("ok", "unsupported", "short", "ragged", "absurd", "count"))
    beh.set_defaults(func=cmd_behave)
