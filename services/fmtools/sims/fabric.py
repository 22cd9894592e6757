"""The super-pod HCCS fabric simulator (top floor; issue 6 "Fabric simulator") and the RoCE plane
between super pods (issue 16): build a fabric file, inject and clear faults, print its topology and
the ground truth.

The fabric file's format, the fault kinds and the probe model are :mod:`noded.pingmesh.fabric`,
which every noded of the super pod uses to read the file back (``--pingmesh-backend sim
--pingmesh-fabric FILE``). Writes are atomic (:func:`faultmesh.files.atomic_write`), so a reader
sees the old or the new file, never half of one. CLI::

    python -m fmtools.sims.fabric init FILE --nodes node-0,node-1,node-2,node-3 [--planes 4]
    python -m fmtools.sims.fabric inject FILE lossy_link --a node-0/1 --b node-0/4 --loss 0.3
    python -m fmtools.sims.fabric clear FILE
    python -m fmtools.sims.fabric topology FILE      # the super-pod JSON for clusterd
    python -m fmtools.sims.fabric truth FILE         # expected localizations

The RoCE plane (file format, fault kinds, probe model: :mod:`noded.pingmesh.rocefabric`, read back
by noded's ``--pingmesh-roce-fabric FILE``) has the same five commands under ``roce``::

    python -m fmtools.sims.fabric roce init FILE --super-pod 1=a-0,a-1 --super-pod 2=b-0,b-1
    python -m fmtools.sims.fabric roce inject FILE pod_uplink --super-pod 2 --loss 0.3
    python -m fmtools.sims.fabric roce clear FILE
    python -m fmtools.sims.fabric roce topology FILE  # the super pods' JSON, nodes with RoceIP
    python -m fmtools.sims.fabric roce truth FILE     # expected localizations

Ground truth (:func:`ground_truth`): per fault, the localization faultmesh should report
(``npu``/``link``/``node``/``plane`` with its ends), used by the bench and tests;
:func:`roce_ground_truth` the same for the RoCE plane (``npu``/``node``/``link``/``superpod``/``switch``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from faultmesh.files import atomic_write
from noded.pingmesh.fabric import (
    FAULT_KINDS,
    Fabric,
    FabricError,
    fault_end,
    read_spec,
)
from noded.pingmesh.rocefabric import ROCE_FAULT_KINDS, RoceFabric

__all__ = [
    "FAULT_KINDS",
    "ROCE_FAULT_KINDS",
    "Fabric",
    "FabricError",
    "RoceFabric",
    "ground_truth",
    "main",
    "read_spec",
    "roce_ground_truth",
    "write_fabric_file",
    "write_roce_file",
]


def write_fabric_file(path: str | os.PathLike, spec: dict[str, Any]) -> None:
    """Validate ``spec`` (raises :class:`FabricError`) and write it atomically (temp file + rename)
    so readers never see half a file. Raises ``OSError`` when it cannot be written."""
    Fabric(spec)
    atomic_write(path, json.dumps(spec, indent=1))


def write_roce_file(path: str | os.PathLike, spec: dict[str, Any]) -> None:
    """:func:`write_fabric_file` for a RoCE plane spec (validated by :class:`RoceFabric`; raises
    :class:`FabricError`, ``OSError``)."""
    RoceFabric(spec)
    atomic_write(path, json.dumps(spec, indent=1))


def roce_ground_truth(fabric: RoceFabric) -> list[dict[str, Any]]:
    """Expected localization per injected RoCE fault: ``{"kind": npu|node|link|superpod|switch,
    "node", "phy", "peer_node", "peer_phy", "super_pod", "fault"}`` (a node's RoCE port is phy 0;
    a link's ends in plane order: super pod, then the node's place in it)."""
    order = {n: (int(sp), k) for n, (sp, k, _) in fabric.nodes.items()}
    out: list[dict[str, Any]] = []
    for f in fabric.faults:
        k = f["kind"]
        if k == "dead_npu":
            out.append({"kind": "npu", "node": str(f["node"]), "phy": 0, "fault": k})
        elif k == "dead_node":
            out.append({"kind": "node", "node": str(f["node"]), "fault": k})
        elif k in ("lossy_link", "slow_link"):
            a, b = sorted((str(f["a"]), str(f["b"])), key=order.__getitem__)
            out.append({"kind": "link", "node": a, "phy": 0, "peer_node": b, "peer_phy": 0, "fault": k})
        elif k == "pod_uplink":
            out.append({"kind": "superpod", "super_pod": str(f["super_pod"]), "fault": k})
        else:
            out.append({"kind": "switch", "fault": k})
    return out


def _super_pods(items: list[str]) -> dict[str, list[str]]:
    """``--super-pod ID=node,node`` values -> ``{id: [nodes]}`` (raises :class:`FabricError`)."""
    out: dict[str, list[str]] = {}
    for item in items:
        spid, sep, names = item.partition("=")
        nodes = [n for n in names.split(",") if n]
        if not sep or not spid.strip() or not nodes:
            raise FabricError(f"--super-pod {item!r}: expected ID=node,node,...")
        out[spid.strip()] = nodes
    return out


def _fault_of(args: argparse.Namespace, keys: tuple[str, ...]) -> dict[str, Any]:
    """The fault an ``inject`` command line names: its kind, the given ``keys`` and ``delay_us``."""
    f: dict[str, Any] = {"kind": args.kind}
    for k in keys:
        if getattr(args, k) is not None:
            f[k] = getattr(args, k)
    if args.delay_us is not None:
        f["delay_us"] = args.delay_us
    return f


def _edit_faults(path: str, write, fault: dict[str, Any] | None) -> None:
    """Add ``fault`` to the file's faults (None: clear them), written back with ``write`` (which
    validates first: a bad edit raises :class:`FabricError` and leaves the file as it was)."""
    spec = read_spec(path)
    if fault is None:
        spec["faults"] = []
    else:
        spec.setdefault("faults", []).append(fault)
    write(path, spec)


def _roce(args: argparse.Namespace) -> None:
    """The ``roce`` commands (module doc). Raises :class:`FabricError`."""
    if args.roce_cmd == "init":
        spec: dict[str, Any] = {
            "roce": True,
            "super_pods": _super_pods(args.super_pod or []),
            "npus_per_node": args.npus,
            "seed": args.seed,
            "faults": [],
        }
        if args.jitter_model:
            spec["jitter_model"] = args.jitter_model
        write_roce_file(args.file, spec)
    elif args.roce_cmd == "inject":
        _edit_faults(args.file, write_roce_file, _fault_of(args, ("node", "a", "b", "loss", "super_pod")))
    elif args.roce_cmd == "clear":
        _edit_faults(args.file, write_roce_file, None)
    elif args.roce_cmd == "topology":
        print(
            json.dumps([sp.to_json_obj() for sp in RoceFabric(read_spec(args.file)).super_pods()], indent=1)
        )
    else:
        print(json.dumps(roce_ground_truth(RoceFabric(read_spec(args.file))), indent=1))


def _roce_parsers(sub) -> None:
    roce = sub.add_parser("roce", help="the RoCE plane between super pods (noded --pingmesh-roce-fabric)")
    rsub = roce.add_subparsers(dest="roce_cmd", required=True)
    p = rsub.add_parser("init", help="write a new RoCE fabric file")
    p.add_argument("file")
    p.add_argument(
        "--super-pod", action="append", metavar="ID=NODES", help="a super pod and its nodes (2 or more pods)"
    )
    p.add_argument("--npus", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jitter-model", choices=("real",), help="real RoCE ICMP noise (rocefabric)")
    p = rsub.add_parser("inject", help="add one RoCE fault")
    p.add_argument("file")
    p.add_argument("kind", choices=ROCE_FAULT_KINDS)
    p.add_argument("--node")
    p.add_argument("--a", help="node")
    p.add_argument("--b", help="node")
    p.add_argument("--super-pod")
    p.add_argument("--loss", type=float)
    p.add_argument("--delay-us", type=float)
    for name in ("clear", "topology", "truth"):
        rsub.add_parser(name).add_argument("file")


def ground_truth(fabric: Fabric) -> list[dict[str, Any]]:
    """Expected localization per injected fault: ``{"kind": npu|link|node|plane, "node", "phy",
    "peer_node", "peer_phy", "plane", "fault"}`` (chip resets have no network truth)."""
    out = []
    for f in fabric.faults:
        k = f["kind"]
        if k == "dead_npu":
            n, p = fault_end(f, k)
            out.append({"kind": "npu", "node": n, "phy": p, "fault": k})
        elif k in ("lossy_link", "slow_link", "flapping_link"):
            (n1, p1), (n2, p2) = sorted(
                (fault_end(f["a"], k), fault_end(f["b"], k)),
                key=lambda e: fabric.sp.nodes[e[0]].devices[e[1]],
            )
            out.append({"kind": "link", "node": n1, "phy": p1, "peer_node": n2, "peer_phy": p2, "fault": k})
        elif k in ("dead_node", "partitioned_node"):
            out.append({"kind": "node", "node": str(f["node"]), "fault": k})
        elif k == "degraded_plane":
            out.append({"kind": "plane", "plane": int(f["plane"]), "fault": k})
    return out


# -- CLI ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m fmtools.sims.fabric`` (see the module doc). Returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="python -m fmtools.sims.fabric", description="HCCS fabric simulator file"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("init", help="write a new fabric file")
    p.add_argument("file")
    p.add_argument("--nodes", required=True, help="comma-separated node names")
    p.add_argument("--npus", type=int, default=16)
    p.add_argument("--planes", type=int, default=0)
    p.add_argument("--super-pod-id", default="0")
    p.add_argument("--first-server-id", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("inject", help="add one fault")
    p.add_argument("file")
    p.add_argument("kind", choices=FAULT_KINDS)
    p.add_argument("--node")
    p.add_argument("--phy", type=int)
    p.add_argument("--a", help="node/phy")
    p.add_argument("--b", help="node/phy")
    p.add_argument("--loss", type=float)
    p.add_argument("--delay-us", type=float)
    p.add_argument("--plane", type=int)
    p.add_argument("--id")
    for name in ("clear", "topology", "truth"):
        sub.add_parser(name).add_argument("file")
    _roce_parsers(sub)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "roce":
            _roce(args)
        elif args.cmd == "init":
            spec = {
                "super_pod_id": args.super_pod_id,
                "nodes": [n for n in args.nodes.split(",") if n],
                "npus_per_node": args.npus,
                "planes": args.planes,
                "first_server_id": args.first_server_id,
                "seed": args.seed,
                "faults": [],
            }
            write_fabric_file(args.file, spec)
        elif args.cmd == "inject":
            _edit_faults(
                args.file,
                write_fabric_file,
                _fault_of(args, ("node", "phy", "a", "b", "loss", "plane", "id")),
            )
        elif args.cmd == "clear":
            _edit_faults(args.file, write_fabric_file, None)
        elif args.cmd == "topology":
            print(json.dumps(Fabric.from_file(args.file).sp.to_json_obj(), indent=1))
        else:
            print(json.dumps(ground_truth(Fabric.from_file(args.file)), indent=1))
    except FabricError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
