"""Super-pod HCCS fabric simulator with injected faults and ground truth, and a pure-Python
hccsping backend on top of it (issue 6 "Fabric simulator").

The fabric is N nodes x M NPUs (SDIDs as in the reference, :func:`fdol.slownet.topology.make_sdid`),
optionally split into switch planes (phy ``p`` uses plane ``p % planes`` for inter-node traffic).
A probe from NPU a to NPU b of ``n`` packets succeeds per packet with probability ``1 - loss(a, b)``;
each answered packet takes ``base_delay_us`` (+ ``inter_node_delay_us`` between nodes) + injected
extra delay + Gaussian jitter (``jitter_us``). Delays are integer microseconds (the driver's
``long`` fields), -1 when nothing answered.

Faults (``kind`` and fields):

- ``dead_npu`` {node, phy}: every packet from or to the NPU is lost;
- ``lossy_link`` {a: {node, phy}, b: {node, phy}, loss (0..1, default 0.3)}: both directions;
- ``slow_link`` {a, b, delay_us (default 50)}: both directions;
- ``dead_node`` {node}: every NPU of the node is dead;
- ``degraded_plane`` {plane, loss (default 0.3), delay_us (default 0)}: inter-node paths whose
  source or destination phy is in the plane;
- ``chip_reset`` {node, phy, id}: once per distinct ``id``, the chip's hccsping tasks are wiped
  (state stopped, no destinations) as after a chip reset — noded must restart them.

**Injecting faults from outside (how several noded processes share one fabric).** The fabric is a
JSON *fabric file*::

    {"super_pod_id": "0", "nodes": ["node-0", "node-1"], "npus_per_node": 16, "planes": 4,
     "first_server_id": 1, "base_delay_us": 3, "inter_node_delay_us": 2, "jitter_us": 0.3,
     "base_loss": 0.0, "seed": 1, "faults": [{"kind": "lossy_link", "a": {"node": "node-0", "phy": 1},
     "b": {"node": "node-0", "phy": 4}, "loss": 0.3}]}

Every process opens it with :meth:`Fabric.from_file`; the fabric re-reads the file when its mtime or
size changes (checked at most every ``reload_s`` = 0.2 s), so editing ``faults`` (atomically: write a
temp file and rename — :func:`write_fabric_file` and the CLI do) changes what every noded measures on
its next collection. CLI::

    python -m faultmesh.dcmi.fabric init FILE --nodes node-0,node-1,node-2,node-3 [--planes 4]
    python -m faultmesh.dcmi.fabric inject FILE lossy_link --a node-0/1 --b node-0/4 --loss 0.3
    python -m faultmesh.dcmi.fabric clear FILE
    python -m faultmesh.dcmi.fabric topology FILE      # the super-pod JSON for clusterd
    python -m faultmesh.dcmi.fabric truth FILE         # expected localizations

Ground truth (:meth:`Fabric.ground_truth`): per fault, the localization faultmesh should report
(``npu``/``link``/``node``/``plane`` with its ends), used by the bench and tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from faultmesh.dcmi.hccsping import (
    STATE_RUNNING,
    STATE_STOPPED,
    ChipInfo,
    DestStat,
    HccspingInfo,
    PingOp,
)
from fdol.slownet.topology import SuperPod, build_super_pod

FAULT_KINDS = ("dead_npu", "lossy_link", "slow_link", "dead_node", "degraded_plane", "chip_reset")


class FabricError(ValueError):
    """A fabric file or fault that cannot be used (the message says why)."""


def _end(d: Any, what: str) -> tuple[str, int]:
    if isinstance(d, str) and "/" in d:
        node, phy = d.rsplit("/", 1)
        d = {"node": node, "phy": phy}
    if not isinstance(d, dict) or "node" not in d or "phy" not in d:
        raise FabricError(f"{what} must be {{node, phy}} or 'node/phy'")
    try:
        return str(d["node"]), int(d["phy"])
    except (TypeError, ValueError):
        raise FabricError(f"{what}: bad phy {d.get('phy')!r}") from None


@dataclass
class _State:
    dead: set[tuple[str, int]]
    link_loss: dict[frozenset, float]
    link_delay: dict[frozenset, float]
    plane_loss: dict[int, float]
    plane_delay: dict[int, float]
    resets: dict[tuple[str, int], str]


class Fabric:
    """One super pod's fabric (see the module doc). Thread-safe; ``path`` enables reloading."""

    def __init__(
        self, spec: dict[str, Any], path: str | os.PathLike | None = None, reload_s: float = 0.2
    ) -> None:
        self.path = Path(path) if path else None
        self.reload_s = reload_s
        self._lock = threading.Lock()
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        self._apply(spec)

    @classmethod
    def from_file(cls, path: str | os.PathLike, reload_s: float = 0.2) -> Fabric:
        """Open a fabric file (raises :class:`FabricError` when unreadable or invalid)."""
        p = Path(path)
        fab = cls(_read(p), p, reload_s)
        st = p.stat()
        fab._stamp = (st.st_mtime, st.st_size)
        return fab

    def _apply(self, spec: dict[str, Any]) -> None:
        try:
            nodes = [str(n) for n in spec["nodes"]]
        except (KeyError, TypeError):
            raise FabricError("fabric needs a 'nodes' list") from None
        if not nodes or len(set(nodes)) != len(nodes):
            raise FabricError("fabric nodes must be a non-empty list of distinct names")
        sp = build_super_pod(
            str(spec.get("super_pod_id", "0")),
            nodes,
            int(spec.get("npus_per_node", 16)),
            int(spec.get("first_server_id", 1)),
            int(spec.get("planes", 0)),
        )
        state = _State(set(), {}, {}, {}, {}, {})
        faults = spec.get("faults") or []
        if not isinstance(faults, list):
            raise FabricError("faults must be a list")
        for f in faults:
            self._add_fault(sp, state, f)
        self.spec = spec
        self.sp = sp
        self.base_delay_us = float(spec.get("base_delay_us", 3.0))
        self.inter_node_delay_us = float(spec.get("inter_node_delay_us", 2.0))
        self.jitter_us = float(spec.get("jitter_us", 0.3))
        self.base_loss = float(spec.get("base_loss", 0.0))
        if not 0 <= self.base_loss <= 1:
            raise FabricError("base_loss must be within 0..1")
        self.faults = faults
        self._state = state
        self._rng = np.random.default_rng(int(spec.get("seed", 1)))

    @staticmethod
    def _add_fault(sp: SuperPod, st: _State, f: Any) -> None:
        if not isinstance(f, dict) or f.get("kind") not in FAULT_KINDS:
            raise FabricError(f"fault must be an object with kind in {FAULT_KINDS}: {f!r}")
        kind = f["kind"]

        def npu(end: tuple[str, int]) -> tuple[str, int]:
            if end[0] not in sp.nodes or end[1] not in sp.nodes[end[0]].devices:
                raise FabricError(f"{kind}: no NPU {end[0]}/{end[1]}")
            return end

        def frac(v: Any, default: float) -> float:
            x = float(default if v is None else v)
            if not 0 <= x <= 1:
                raise FabricError(f"{kind}: loss {x} outside 0..1")
            return x

        if kind == "dead_npu":
            st.dead.add(npu(_end(f, kind)))
        elif kind == "dead_node":
            node = str(f.get("node"))
            if node not in sp.nodes:
                raise FabricError(f"dead_node: no node {node}")
            st.dead.update((node, p) for p in sp.nodes[node].devices)
        elif kind in ("lossy_link", "slow_link"):
            a, b = npu(_end(f.get("a"), kind + ".a")), npu(_end(f.get("b"), kind + ".b"))
            if a == b:
                raise FabricError(f"{kind}: both ends are {a}")
            key = frozenset((a, b))
            if kind == "lossy_link":
                st.link_loss[key] = 1 - (1 - st.link_loss.get(key, 0.0)) * (1 - frac(f.get("loss"), 0.3))
            else:
                st.link_delay[key] = st.link_delay.get(key, 0.0) + float(f.get("delay_us", 50))
        elif kind == "degraded_plane":
            plane = int(f.get("plane", -1))
            if not sp.planes or plane not in sp.planes:
                raise FabricError(f"degraded_plane: no plane {plane}")
            st.plane_loss[plane] = frac(f.get("loss"), 0.3)
            st.plane_delay[plane] = float(f.get("delay_us", 0))
        else:
            st.resets[npu(_end(f, kind))] = str(f.get("id", "1"))

    def maybe_reload(self) -> None:
        """Re-read the fabric file when it changed (at most every ``reload_s``); a bad file is kept
        out (the previous state stays) and reported once per change on stderr."""
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._checked < self.reload_s:
            return
        self._checked = now
        try:
            st = self.path.stat()
        except OSError:
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            spec = _read(self.path)
            with self._lock:
                self._apply(spec)
        except FabricError as e:
            sys.stderr.write(f"fabric file {self.path} rejected: {e}\n")

    # -- probes ---------------------------------------------------------------------------------
    def reset_id(self, node: str, phy: int) -> str | None:
        """The current chip-reset id injected for the NPU (None when none)."""
        self.maybe_reload()
        return self._state.resets.get((node, phy))

    def probe(self, src: tuple[str, int], dst_sdid: int, packets: int) -> tuple[int, int, list[float]]:
        """Send ``packets`` from NPU ``src`` to ``dst_sdid``: (succeeded, failed, delays of the
        answered packets in µs). An SDID outside the pod never answers."""
        self.maybe_reload()
        with self._lock:
            st = self._state
            dst = self.sp.locate(dst_sdid)
            if dst is None or src in st.dead or dst in st.dead:
                return 0, packets, []
            key = frozenset((src, dst))
            keep = (1 - self.base_loss) * (1 - st.link_loss.get(key, 0.0))
            extra = st.link_delay.get(key, 0.0)
            delay = self.base_delay_us
            if src[0] != dst[0]:
                delay += self.inter_node_delay_us
                for plane in {self.sp.plane_of(src[1]), self.sp.plane_of(dst[1])}:
                    if plane is not None and plane in st.plane_loss:
                        keep *= 1 - st.plane_loss[plane]
                        extra += st.plane_delay[plane]
            suc = int(self._rng.binomial(packets, keep))
            d = delay + extra + self._rng.normal(0.0, self.jitter_us, suc)
        return suc, packets - suc, [max(0.5, x) for x in d.tolist()]

    def probe_many(
        self, probes: list[tuple[str, int, int]], packets: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized :meth:`probe` for many (src node, src phy, dst SDID): arrays of succeeded and
        failed packets and the mean delay of the answered packets (µs, -1 when none answered)."""
        self.maybe_reload()
        with self._lock:
            st = self._state
            keep = np.empty(len(probes))
            base = np.empty(len(probes))
            for i, (node, phy, dst_sdid) in enumerate(probes):
                src = (node, phy)
                dst = self.sp.locate(dst_sdid)
                if dst is None or src in st.dead or dst in st.dead:
                    keep[i], base[i] = 0.0, 0.0
                    continue
                key = frozenset((src, dst))
                k = (1 - self.base_loss) * (1 - st.link_loss.get(key, 0.0))
                d = self.base_delay_us + st.link_delay.get(key, 0.0)
                if node != dst[0]:
                    d += self.inter_node_delay_us
                    for plane in {self.sp.plane_of(phy), self.sp.plane_of(dst[1])}:
                        if plane is not None and plane in st.plane_loss:
                            k *= 1 - st.plane_loss[plane]
                            d += st.plane_delay[plane]
                keep[i], base[i] = k, d
            suc = self._rng.binomial(packets, keep)
            noise = self._rng.normal(0.0, self.jitter_us, len(probes)) / np.sqrt(np.maximum(suc, 1))
        avg = np.where(suc > 0, np.maximum(0.5, base + noise), -1.0)
        return suc, packets - suc, avg

    def ground_truth(self) -> list[dict[str, Any]]:
        """Expected localization per injected fault: ``{"kind": npu|link|node|plane, "node", "phy",
        "peer_node", "peer_phy", "plane", "fault"}`` (chip resets have no network truth)."""
        out = []
        for f in self.faults:
            k = f["kind"]
            if k == "dead_npu":
                n, p = _end(f, k)
                out.append({"kind": "npu", "node": n, "phy": p, "fault": k})
            elif k in ("lossy_link", "slow_link"):
                (n1, p1), (n2, p2) = sorted(
                    (_end(f["a"], k), _end(f["b"], k)), key=lambda e: self.sp.nodes[e[0]].devices[e[1]]
                )
                out.append(
                    {"kind": "link", "node": n1, "phy": p1, "peer_node": n2, "peer_phy": p2, "fault": k}
                )
            elif k == "dead_node":
                out.append({"kind": "node", "node": str(f["node"]), "fault": k})
            elif k == "degraded_plane":
                out.append({"kind": "plane", "plane": int(f["plane"]), "fault": k})
        return out

    def chips(self, node: str) -> list[ChipInfo]:
        """The chips of ``node`` as the driver would list them (card = phy // 2, device = phy % 2)."""
        n = self.sp.nodes.get(node)
        if n is None:
            raise FabricError(f"node {node} is not in the fabric")
        spid = int(self.sp.super_pod_id)
        return [ChipInfo(p, p // 2, p % 2, s, spid, n.server_index) for p, s in sorted(n.devices.items())]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FabricError(f"cannot read fabric file {path}: {e}") from None
    if not isinstance(data, dict):
        raise FabricError("fabric file must hold a JSON object")
    return data


def write_fabric_file(path: str | os.PathLike, spec: dict[str, Any]) -> None:
    """Validate ``spec`` and write it atomically (temp file + rename) so readers never see half a file."""
    Fabric(spec)  # raises FabricError
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name + ".")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, indent=1)
    os.replace(tmp, p)


# -- the pure-Python hccsping backend -------------------------------------------------------------
@dataclass
class _Task:
    op: PingOp
    started: float
    last_query: float
    rounds_total: int = 0


class SimHccsping:
    """:class:`faultmesh.dcmi.hccsping.HccspingBackend` for one node of a :class:`Fabric`.

    A running task pings every destination with ``pkt_send_num`` packets every ``task_interval``
    seconds; ``info`` returns the statistics of the rounds since the previous ``info`` call (at
    least one round). ``clock`` (s) is injectable for tests.
    """

    def __init__(self, fabric: Fabric, node: str, clock=time.monotonic) -> None:
        self.fabric = fabric
        self.node = node
        self.clock = clock
        self._tasks: dict[tuple[int, int], _Task] = {}
        self._resets_seen: dict[int, str | None] = {}
        self._lock = threading.Lock()

    def chips(self) -> list[ChipInfo]:
        """This node's chips from the fabric."""
        return self.fabric.chips(self.node)

    def _phys(self) -> set[int]:
        return {c.phy_id for c in self.chips()}

    def _check_reset(self, phy: int) -> None:
        rid = self.fabric.reset_id(self.node, phy)
        if rid is not None and self._resets_seen.get(phy) != rid:
            self._resets_seen[phy] = rid
            for t in (0, 1):
                self._tasks.pop((phy, t), None)

    def start(self, phy_id: int, op: PingOp) -> None:
        """Start (or replace) task ``op.task_id`` on the chip (validates ``op``)."""
        op.validate()
        if phy_id not in self._phys():
            raise ValueError(f"no chip with physical id {phy_id}")
        now = self.clock()
        with self._lock:
            self._check_reset(phy_id)
            self._tasks[(phy_id, op.task_id)] = _Task(op, now, now)

    def stop(self, phy_id: int, task_id: int) -> None:
        """Stop the task (no error when it was not running)."""
        with self._lock:
            self._tasks.pop((phy_id, task_id), None)

    def state(self, phy_id: int, task_id: int) -> int:
        """1 running, 0 stopped."""
        with self._lock:
            self._check_reset(phy_id)
            return STATE_RUNNING if (phy_id, task_id) in self._tasks else STATE_STOPPED

    def info(self, phy_id: int, task_id: int) -> HccspingInfo:
        """Statistics per destination since the last call (empty when the task is not running)."""
        with self._lock:
            self._check_reset(phy_id)
            task = self._tasks.get((phy_id, task_id))
            if task is None:
                return HccspingInfo()
            now = self.clock()
            rounds = max(1, int((now - task.last_query) // task.op.task_interval))
            task.last_query = now
            task.rounds_total += rounds
        op = task.op
        out = []
        for addr in op.dst_addrs:
            try:
                sdid = int(addr)
            except ValueError:
                sdid = -1
            suc, fail, delays = self.fabric.probe((self.node, phy_id), sdid, rounds * op.pkt_send_num)
            if suc:
                arr = np.asarray(delays)
                stats = [int(round(x)) for x in (arr.max(), arr.min(), arr.mean(), np.percentile(arr, 95))]
            else:
                stats = [-1, -1, -1, -1]
            out.append(DestStat(addr, suc, fail, *stats, rounds, task.rounds_total))
        return HccspingInfo(out)


# -- CLI ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """``python -m faultmesh.dcmi.fabric`` (see the module doc). Returns the exit status."""
    ap = argparse.ArgumentParser(
        prog="python -m faultmesh.dcmi.fabric", description="HCCS fabric simulator file"
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
    args = ap.parse_args(argv)
    try:
        if args.cmd == "init":
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
            spec = _read(Path(args.file))
            f: dict[str, Any] = {"kind": args.kind}
            for k in ("node", "phy", "a", "b", "loss", "plane", "id"):
                if getattr(args, k) is not None:
                    f[k] = getattr(args, k)
            if args.delay_us is not None:
                f["delay_us"] = args.delay_us
            spec.setdefault("faults", []).append(f)
            write_fabric_file(args.file, spec)
        elif args.cmd == "clear":
            spec = _read(Path(args.file))
            spec["faults"] = []
            write_fabric_file(args.file, spec)
        elif args.cmd == "topology":
            print(json.dumps(Fabric.from_file(args.file).sp.to_json_obj(), indent=1))
        else:
            print(json.dumps(Fabric.from_file(args.file).ground_truth(), indent=1))
    except FabricError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
