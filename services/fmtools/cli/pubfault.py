"""``faultmesh pubfault send``: send one public fault to ClusterD over ``/PubFault/SendPublicFault``.

A node clusterd has never seen needs ``--new-node`` (issue 31: a typo such as ``srever-1`` made a
node that stayed UnHealthy): the CLI asks clusterd's HTTP API first and refuses with exit 4 and the
closest known names. clusterd itself keeps the reference's behaviour for every other client (a
public fault may name any node).
"""

from __future__ import annotations

import argparse
import re
import time
import uuid

from faultmesh._pb import pubfault_pb2, pubfault_pb2_grpc
from faultmesh.config import positive_float
from fmtools.cli._grpc import call
from fmtools.cli.common import Rejected, Unreachable, UsageError, add_server_flags, emit, run, server_error
from fmtools.cli.suggest import did_you_mean, get_node, public_codes

CODE_RE = re.compile(r"^[0-9A-Fa-f]{9}$")  # the fault rule of clusterd.api.pubfault: 9 characters
MAX_DEVICE_ID = 31


def build_request(args: argparse.Namespace) -> pubfault_pb2.PublicFaultRequest:
    """The PublicFaultRequest for the CLI flags (ids are fresh UUIDs, times now in ms). Raises
    :class:`UsageError` for a ``--code`` that is not 9 hex digits or ``--devices`` that are not
    integers in [0, 31] (clusterd would drop the fault: checked before sending)."""
    now = int(time.time() * 1000)
    if not CODE_RE.match(args.code):
        raise UsageError(f"--code must be 9 hex digits (e.g. 010001001), got {args.code!r}")
    try:
        devices = [int(d) for d in args.devices.split(",") if d.strip()]
    except ValueError:
        raise UsageError(f"--devices must be a comma list of integers, got {args.devices!r}") from None
    bad = [d for d in devices if not 0 <= d <= MAX_DEVICE_ID]
    if bad or not 1 <= len(devices) <= MAX_DEVICE_ID + 1 or len(set(devices)) != len(devices):
        raise UsageError(
            f"--devices must be 1..32 distinct device ids in [0, {MAX_DEVICE_ID}], got {args.devices!r}"
        )
    fault = pubfault_pb2.Fault(
        faultId=args.fault_id or uuid.uuid4().hex,
        faultType=args.type,
        faultCode=args.code,
        faultTime=now,
        assertion=args.assertion,
        description=args.description,
        influence=[pubfault_pb2.PubFaultInfo(nodeName=args.node, deviceIds=devices)],
    )
    return pubfault_pb2.PublicFaultRequest(
        id=uuid.uuid4().hex, timestamp=now, version="1.0", resource=args.resource, faults=[fault]
    )


@run
def cmd_send(args: argparse.Namespace) -> int:
    """Send one public fault; prints the response code and info. Exit 1 unless code 0."""
    req = build_request(args)
    if not args.new_node:
        try:
            get_node(args, args.node, hint="; --new-node sends a fault for a node it has not seen yet")
        except Unreachable as e:
            raise Unreachable(f"{e} (checking --node needs it; --new-node skips the check)") from None
    resp = call(args, pubfault_pb2_grpc.PubFaultStub, "SendPublicFault", req, timeout_s=args.timeout_s)
    if resp.code != 0:
        hint = {
            409: " (clusterd's log line 'public fault dropped' names the failed rule)",
            410: f" (--resource {args.resource!r} is not in clusterd's public fault table, or it went over"
            " its rate limit: clusterd's log line 'public fault rejected' says which)",
        }.get(resp.code, "")
        if resp.code == 409 and args.code not in public_codes():
            hint += f"; --code {args.code} is not in faultmesh's public fault table" + did_you_mean(
                args.code, public_codes()
            )
        raise server_error(f"clusterd answered {resp.code}: {resp.info}{hint}", Rejected)
    emit(
        args,
        {"code": resp.code, "info": resp.info, "faultId": req.faults[0].faultId},
        [(resp.code, resp.info, req.faults[0].faultId)],
        ("CODE", "INFO", "FAULT ID"),
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pubfault", help="public faults (PubFault service)")
    s = p.add_subparsers(dest="pubfault_cmd", metavar="VERB")
    s.required = True
    q = s.add_parser("send", help="send one public fault")
    add_server_flags(q)
    q.add_argument("--resource", default="CCAE", help="sender (must be in the public fault table)")
    q.add_argument("--code", required=True, help="public fault code: 9 hex digits, e.g. 010001001")
    q.add_argument("--node", required=True, help="the node (one clusterd knows, unless --new-node)")
    q.add_argument(
        "--new-node",
        action="store_true",
        help="send even though clusterd has never seen --node (a node that joins with this fault)",
    )
    q.add_argument("--devices", default="0", help="comma list of device ids in [0, 31] (default: 0)")
    q.add_argument("--type", default="NPU", choices=("NPU", "Node", "Network", "Storage"))
    q.add_argument("--assertion", default="occur", choices=("occur", "recover", "once"))
    q.add_argument("--fault-id", help="fault id (default: a fresh UUID); reuse it to recover")
    q.add_argument("--description", default="")
    q.add_argument(
        "--timeout-s", type=positive_float, default=10.0, help="wait at most this long for the answer (s)"
    )
    q.set_defaults(func=cmd_send)
