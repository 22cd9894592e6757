"""The simulated HCCS fabric as noded's pingmesh sees it: the fabric file read back, probes through
it, and a pure-Python hccsping backend on top (``--pingmesh-backend sim``; issue 6 "Fabric simulator").

The file is written by the simulator proper (:mod:`fmtools.sims.fabric`: ``init``, ``inject``,
``clear``, ground truth); every noded of a super pod opens the same file with
:meth:`Fabric.from_file`, which re-reads it when its content changes (checked at most every
``reload_s`` = 0.2 s), so a fault injected into the file changes what every noded measures on its
next collection.

File (JSON object)::

    {"super_pod_id": "0", "nodes": ["node-0", "node-1"], "npus_per_node": 16, "planes": 4,
     "first_server_id": 1, "base_delay_us": 3, "inter_node_delay_us": 2, "jitter_us": 0.3,
     "base_loss": 0.0, "seed": 1, "faults": [{"kind": "lossy_link", "a": {"node": "node-0", "phy": 1},
     "b": {"node": "node-0", "phy": 4}, "loss": 0.3}]}

The fabric is N nodes x M NPUs (SDIDs as in the reference, :func:`fdol.slownet.topology.make_sdid`),
optionally split into switch planes (phy ``p`` uses plane ``p % planes`` for inter-node traffic).
A probe from NPU a to NPU b of ``n`` packets succeeds per packet with probability ``1 - loss(a, b)``;
each answered packet takes ``base_delay_us`` (+ ``inter_node_delay_us`` between nodes) + injected
extra delay + Gaussian jitter (``jitter_us``). Delays are integer microseconds (the driver's
``long`` fields), -1 when nothing answered.

Real jitter (``"jitter_model": "real"`` sets every default below; each key can also be set alone,
all off by default). How measured HCCS / RoCE pings behave, not the shape a detector wants:

- ``path_spread_us`` (1.5): every path has its own fixed base (cable length, hop count, SerDes), a
  uniform 0..spread offset, the same both ways (a ping is a round trip);
- ``tail_prob`` (0.003) / ``tail_us`` (40): a few packets wait much longer (firmware scheduling,
  interrupt coalescing, a switch's slow path): an exponential extra delay of mean ``tail_us`` per
  outlier — so a period's average sometimes jumps by a few µs on one path;
- ``burst_prob`` (0.00003): per path and probe round (10 packets, one ``task_interval``), the whole
  round is lost (a queue overflow, a link retrain, an ICMP rate limit): loss comes in bursts of
  10 %, not as independent packets;
- ``load_us`` (1.5) / ``load_cv`` (0.4): training traffic queues the probes: each switch plane (or,
  without planes, each node's uplinks) adds a queueing delay whose level changes every period by
  ``load_cv`` (the same for every path of the plane) and whose per-packet part is exponential;
- ``host_hiccup_prob`` (0 for HCCS, whose pings run in the NPU; 0.002 for the RoCE plane, whose ICMP
  pings run in user space) / ``host_hiccup_us`` (30): in a period a node's host is busy and every
  ping it sends in one round is that much later.

Faults (``kind`` and fields):

- ``dead_npu`` {node, phy}: every packet from or to the NPU is lost;
- ``lossy_link`` {a: {node, phy}, b: {node, phy}, loss (0..1, default 0.3)}: both directions;
- ``slow_link`` {a, b, delay_us (default 50)}: both directions;
- ``dead_node`` {node}: every NPU of the node is dead;
- ``degraded_plane`` {plane, loss (default 0.3), delay_us (default 0)}: inter-node paths whose
  source or destination phy is in the plane;
- ``flapping_link`` {a, b, p_down (0.3), p_up (0.5)}: the link goes down and up again; per probe
  round (one task_interval) an up link goes down with ``p_down`` and a down one comes back with
  ``p_up`` (a down round loses every packet, both ways: one link state per round for both
  directions);
- ``partitioned_node`` {node}: the node's uplinks are gone: every inter-node packet from or to it
  is lost, its intra-node paths are fine;
- ``chip_reset`` {node, phy, id}: once per distinct ``id``, the chip's hccsping tasks are wiped
  (state stopped, no destinations) as after a chip reset — noded must restart them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from faultmesh.dcmi.hccsping import (
    ChipInfo,
)
from faultmesh.files import FileWatch
from faultmesh.log import event
from fdol.slownet.topology import SuperPod, build_super_pod

log = logging.getLogger("noded.pingmesh.fabric")

FAULT_KINDS = (
    "dead_npu",
    "lossy_link",
    "slow_link",
    "dead_node",
    "degraded_plane",
    "chip_reset",
    "flapping_link",
    "partitioned_node",
)
REAL_JITTER = {
    "path_spread_us": 1.5,
    "tail_prob": 0.003,
    "tail_us": 40.0,
    "burst_prob": 0.00003,
    "load_us": 1.5,
    "load_cv": 0.4,
    "host_hiccup_prob": 0.0,
    "host_hiccup_us": 30.0,
}
ROUND_PACKETS = 10  # packets per probe round (pkt_send_num)


class FabricError(ValueError):
    """A fabric file or fault that cannot be used (the message says why)."""


def fault_end(d: Any, what: str) -> tuple[str, int]:
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
    flapping: dict[frozenset, tuple[float, float]]
    partitioned: set[str]


class Fabric:
    """One super pod's fabric (see the module doc). Thread-safe; ``path`` enables reloading."""

    def __init__(
        self, spec: dict[str, Any], path: str | os.PathLike | None = None, reload_s: float = 0.2
    ) -> None:
        self.path = Path(path) if path else None
        self.reload_s = reload_s
        self._lock = threading.Lock()
        self._watch = FileWatch(self.path) if self.path else None
        self._checked = 0.0
        self._apply(spec)

    @classmethod
    def from_file(cls, path: str | os.PathLike, reload_s: float = 0.2) -> Fabric:
        """Open a fabric file (raises :class:`FabricError` when unreadable or invalid)."""
        watch = FileWatch(path)
        watch.changed()  # the baseline before reading: a write from now on shows on the next look
        fab = cls(read_spec(path), path, reload_s)
        fab._watch = watch
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
        state = _State(set(), {}, {}, {}, {}, {}, {}, set())
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
        real = REAL_JITTER if spec.get("jitter_model") == "real" else dict.fromkeys(REAL_JITTER, 0.0)
        self.noise = {k: float(spec.get(k, real[k])) for k in REAL_JITTER}
        for k in ("tail_prob", "burst_prob", "host_hiccup_prob"):
            if not 0 <= self.noise[k] <= 1:
                raise FabricError(f"{k} must be within 0..1")
        self._offsets: dict[frozenset, float] = {}
        self._flap_down: dict[frozenset, bool] = {}
        self._flap_share: dict[frozenset, float] = {}
        self._load: dict[int, float] = {}
        self._hiccup: set[str] = set()
        self._load_period = -1

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
            st.dead.add(npu(fault_end(f, kind)))
        elif kind == "dead_node":
            node = str(f.get("node"))
            if node not in sp.nodes:
                raise FabricError(f"dead_node: no node {node}")
            st.dead.update((node, p) for p in sp.nodes[node].devices)
        elif kind in ("lossy_link", "slow_link"):
            a, b = npu(fault_end(f.get("a"), kind + ".a")), npu(fault_end(f.get("b"), kind + ".b"))
            if a == b:
                raise FabricError(f"{kind}: both ends are {a}")
            key = frozenset((a, b))
            if kind == "lossy_link":
                st.link_loss[key] = 1 - (1 - st.link_loss.get(key, 0.0)) * (1 - frac(f.get("loss"), 0.3))
            else:
                st.link_delay[key] = st.link_delay.get(key, 0.0) + float(f.get("delay_us", 50))
        elif kind == "flapping_link":
            a, b = npu(fault_end(f.get("a"), kind + ".a")), npu(fault_end(f.get("b"), kind + ".b"))
            if a == b:
                raise FabricError(f"{kind}: both ends are {a}")
            st.flapping[frozenset((a, b))] = (frac(f.get("p_down"), 0.3), frac(f.get("p_up"), 0.5))
        elif kind == "partitioned_node":
            node = str(f.get("node"))
            if node not in sp.nodes:
                raise FabricError(f"partitioned_node: no node {node}")
            st.partitioned.add(node)
        elif kind == "degraded_plane":
            plane = int(f.get("plane", -1))
            if not sp.planes or plane not in sp.planes:
                raise FabricError(f"degraded_plane: no plane {plane}")
            st.plane_loss[plane] = frac(f.get("loss"), 0.3)
            st.plane_delay[plane] = float(f.get("delay_us", 0))
        else:
            st.resets[npu(fault_end(f, kind))] = str(f.get("id", "1"))

    def maybe_reload(self) -> None:
        """Re-read the fabric file when it changed (at most every ``reload_s``); a bad or missing
        file is kept out (the previous state stays) and logged once per change."""
        if self._watch is None:
            return
        now = time.monotonic()
        if now - self._checked < self.reload_s:
            return
        self._checked = now
        if not self._watch.changed():
            return
        try:
            spec = read_spec(self.path)
            with self._lock:
                self._apply(spec)
        except FabricError as e:
            event(log, logging.WARNING, "fabric file rejected", file=str(self.path), error=str(e))

    # -- probes ---------------------------------------------------------------------------------
    def reset_id(self, node: str, phy: int) -> str | None:
        """The current chip-reset id injected for the NPU (None when none)."""
        self.maybe_reload()
        return self._state.resets.get((node, phy))

    def _new_period(self, rounds: int) -> None:
        """Draw the per-period noise (plane or node load levels, busy hosts) and the down share of
        each flapping link over ``rounds`` rounds."""
        self._flap_share = {
            key: self._flap_rounds(key, rounds) / max(rounds, 1) for key in self._state.flapping
        }
        nz = self.noise
        groups = list(self.sp.planes) if self.sp.planes else list(range(len(self.sp.nodes)))
        self._load = {
            g: nz["load_us"] * max(0.0, 1.0 + nz["load_cv"] * float(self._rng.normal())) for g in groups
        }
        hp = nz["host_hiccup_prob"]
        self._hiccup = {n for n in self.sp.nodes if hp and self._rng.random() < hp}

    def _flap_rounds(self, key: frozenset, rounds: int) -> int:
        """Rounds (of ``rounds``) the flapping link ``key`` is down, advancing its state."""
        p_down, p_up = self._state.flapping[key]
        down = self._flap_down.get(key, False)
        n = 0
        for _ in range(rounds):
            down = (self._rng.random() < p_down) if not down else not (self._rng.random() < p_up)
            n += down
        self._flap_down[key] = down
        return n

    def _path(
        self, src: tuple[str, int], dst: tuple[str, int] | None, rounds: int
    ) -> tuple[float, float, float]:
        """(packet keep probability, fixed delay µs, mean queueing delay µs) of one probe path for
        this period (faults and real-jitter levels; caller holds the lock)."""
        st = self._state
        if dst is None or src in st.dead or dst in st.dead:
            return 0.0, 0.0, 0.0
        inter = src[0] != dst[0]
        if inter and (src[0] in st.partitioned or dst[0] in st.partitioned):
            return 0.0, 0.0, 0.0
        key = frozenset((src, dst))
        keep = (1 - self.base_loss) * (1 - st.link_loss.get(key, 0.0))
        d = self.base_delay_us + st.link_delay.get(key, 0.0)
        if key in st.flapping:
            keep *= 1 - self._flap_share.get(key, 0.0)
        spread = self.noise["path_spread_us"]
        if spread:
            off = self._offsets.get(key)
            if off is None:
                off = self._offsets[key] = float(self._rng.uniform(0, spread))
            d += off
        queue = 0.0
        if inter:
            d += self.inter_node_delay_us
            planes = {self.sp.plane_of(src[1]), self.sp.plane_of(dst[1])}
            for plane in planes:
                if plane is not None and plane in st.plane_loss:
                    keep *= 1 - st.plane_loss[plane]
                    d += st.plane_delay[plane]
            if self._load:
                if self.sp.planes:
                    queue = sum(self._load.get(p, 0.0) for p in planes if p is not None) / len(planes)
                else:
                    names = sorted(self.sp.nodes)
                    queue = (self._load[names.index(src[0])] + self._load[names.index(dst[0])]) / 2
        if src[0] in self._hiccup:
            d += self.noise["host_hiccup_us"] / max(rounds, 1)  # one round of the period is late
        return keep, d, queue

    def _lost_rounds(self, rounds: int, size: int | None = None):
        """Rounds lost whole to bursts (``burst_prob`` per round)."""
        bp = self.noise["burst_prob"]
        if not bp:
            return 0 if size is None else np.zeros(size, dtype=np.int64)
        return self._rng.binomial(rounds, bp, size)

    def probe(self, src: tuple[str, int], dst_sdid: int, packets: int) -> tuple[int, int, list[float]]:
        """Send ``packets`` from NPU ``src`` to ``dst_sdid``: (succeeded, failed, delays of the
        answered packets in µs). An SDID outside the pod never answers. Each call is one period
        of the real-jitter model (levels drawn anew)."""
        self.maybe_reload()
        with self._lock:
            rounds = max(1, packets // ROUND_PACKETS)
            self._new_period(rounds)
            keep, delay, queue = self._path(src, self.sp.locate(dst_sdid), rounds)
            sent = max(0, packets - int(self._lost_rounds(rounds)) * ROUND_PACKETS)
            suc = int(self._rng.binomial(sent, keep)) if keep else 0
            d = delay + self._rng.normal(0.0, self.jitter_us, suc)
            d += self._extra(suc, queue)
        return suc, packets - suc, [max(0.5, x) for x in d.tolist()]

    def _extra(self, n: int, queue: float) -> np.ndarray:
        """Per-packet queueing (exponential, mean ``queue``) and tail outliers for ``n`` packets."""
        out = np.zeros(n)
        if queue:
            out += self._rng.exponential(queue, n)
        tp = self.noise["tail_prob"]
        if tp:
            out += np.where(self._rng.random(n) < tp, self._rng.exponential(self.noise["tail_us"], n), 0.0)
        return out

    def probe_many(
        self, probes: list[tuple[str, int, int]], packets: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized :meth:`probe` for many (src node, src phy, dst SDID), one period: arrays of
        succeeded and failed packets and the mean delay of the answered packets (µs, -1 when none
        answered)."""
        self.maybe_reload()
        with self._lock:
            rounds = max(1, packets // ROUND_PACKETS)
            self._new_period(rounds)
            n = len(probes)
            keep, base, queue = np.empty(n), np.empty(n), np.empty(n)
            for i, (node, phy, dst_sdid) in enumerate(probes):
                keep[i], base[i], queue[i] = self._path((node, phy), self.sp.locate(dst_sdid), rounds)
            sent = np.maximum(0, packets - self._lost_rounds(rounds, n) * ROUND_PACKETS)
            suc = self._rng.binomial(sent, keep)
            noise = mean_noise(
                self._rng, suc, self.jitter_us, queue, self.noise["tail_prob"], self.noise["tail_us"]
            )
        avg = np.where(suc > 0, np.maximum(0.5, base + noise), -1.0)
        return suc, packets - suc, avg

    def chips(self, node: str) -> list[ChipInfo]:
        """The chips of ``node`` as the driver would list them (card = phy // 2, device = phy % 2)."""
        n = self.sp.nodes.get(node)
        if n is None:
            raise FabricError(f"node {node} is not in the fabric")
        spid = int(self.sp.super_pod_id)
        return [ChipInfo(p, p // 2, p % 2, s, spid, n.server_index) for p, s in sorted(n.devices.items())]


def mean_noise(
    rng: np.random.Generator,
    suc: np.ndarray,
    jitter_us: float,
    queue: np.ndarray,
    tail_prob: float,
    tail_us: float,
) -> np.ndarray:
    """The noise of the mean delay of ``suc`` answered packets per path (µs): Gaussian jitter,
    exponential queueing of mean ``queue`` per packet, ``tail_prob`` outliers of mean ``tail_us``."""
    m = np.maximum(suc, 1)
    noise = rng.normal(0.0, jitter_us, len(suc)) / np.sqrt(m)
    if queue.any():  # the mean of m exponentials: a gamma(m, queue / m)
        noise += np.where(queue > 0, rng.gamma(m, np.maximum(queue, 1e-9) / m), 0.0)
    if tail_prob:
        outliers = rng.binomial(suc, tail_prob)
        tail = rng.gamma(np.maximum(outliers, 1), tail_us)
        noise += np.where(outliers > 0, tail / m, 0.0)
    return noise


def read_spec(path: str | os.PathLike) -> dict[str, Any]:
    """The fabric file's JSON object. Raises :class:`FabricError` when unreadable or not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FabricError(f"cannot read fabric file {path}: {e}") from None
    if not isinstance(data, dict):
        raise FabricError("fabric file must hold a JSON object")
    return data


__all__ = ["FAULT_KINDS", "REAL_JITTER", "Fabric", "FabricError", "mean_noise", "read_spec"]
