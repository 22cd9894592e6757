"""The simulated RoCE parameter plane between super pods (issue 16): the plane's nodes, their RoCE
IPs, ICMP probes through it, and faults — what noded's RoCE pings see (``--pingmesh-roce-fabric``).

File (JSON object, written by the bench, tests or by hand; every noded of the plane opens the same one)::

    {"roce": true, "super_pods": {"1": ["a-0", "a-1", ...], "2": [...]}, "npus_per_node": 8,
     "base_delay_us": 12, "hop_delay_us": 3, "jitter_us": 1.5, "base_loss": 0.0, "seed": 1,
     "jitter_model": "real", "faults": [{"kind": "pod_uplink", "super_pod": "2", "loss": 0.3}]}

Every node of super pod ``s`` (k-th in its list) has the RoCE IP ``10.<s>.<k // 250>.<k % 250 + 1>``
and server index ``k + 1``; :meth:`RoceFabric.super_pods` gives the topologies with those IPs
(``RoceIP``, :mod:`fdol.slownet.topology`). A probe between nodes of two super pods crosses the
source pod's uplink, the RoCE switch and the destination pod's uplink: ``base_delay_us`` +
2 x ``hop_delay_us``. How real RoCE ICMP pings behave (``"jitter_model": "real"``, each key also
settable alone): the pings run in user space, so host scheduling dominates — ``tail_prob`` (0.01)
outlier packets of mean ``tail_us`` (100 µs), ``host_hiccup_prob`` (0.003) a node's host busy for one
round of a period (``host_hiccup_us``, 300 µs); the uplinks queue under training traffic
(``load_us`` 2, ``load_cv`` 0.5 per period and pod); congestion drops whole rounds (``burst_prob``
0.00003). ICMP sends ``pingTimes`` packets per round (10 here, one round per task_interval).

Faults: ``dead_npu`` {node} (the node's RoCE port: every packet from or to it lost), ``dead_node``
{node} (same, the whole OS), ``lossy_link`` / ``slow_link`` {a: node, b: node, loss | delay_us}
(the path between two nodes, both ways), ``pod_uplink`` {super_pod, loss (0.3), delay_us (0)} (the
pod's links to the RoCE switch), ``switch`` {loss (0.3), delay_us (0)} (the RoCE switch: every path).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fdol.slownet.topology import SuperPod, build_super_pod
from noded.pingmesh.fabric import ROUND_PACKETS, FabricError, mean_noise

ROCE_FAULT_KINDS = ("dead_npu", "dead_node", "lossy_link", "slow_link", "pod_uplink", "switch")
REAL_ROCE_JITTER = {
    "tail_prob": 0.01,
    "tail_us": 100.0,
    "host_hiccup_prob": 0.003,
    "host_hiccup_us": 300.0,
    "load_us": 2.0,
    "load_cv": 0.5,
    "burst_prob": 0.00003,
}


def roce_ip(super_pod_id: str, k: int) -> str:
    """The RoCE IP of the k-th node (from 0) of a super pod (module doc)."""
    return f"10.{int(super_pod_id) % 256}.{k // 250}.{k % 250 + 1}"


class RoceFabric:
    """The RoCE plane of the module doc. Not thread-safe (noded's sim backend calls it under its
    own lock); ``probe_many`` is one period."""

    def __init__(self, spec: dict[str, Any]) -> None:
        pods = spec.get("super_pods")
        if not isinstance(pods, dict) or len(pods) < 2:
            raise FabricError("a RoCE fabric needs 'super_pods': {id: [nodes]} with 2 super pods or more")
        self.spec = spec
        self.npus = int(spec.get("npus_per_node", 8))
        self.nodes: dict[str, tuple[str, int, str]] = {}  # node -> (super pod, server index, ip)
        self.pods: dict[str, list[str]] = {}
        for spid, names in sorted(pods.items(), key=lambda kv: int(kv[0])):
            if not str(spid).isdigit() or not isinstance(names, list) or not names:
                raise FabricError(f"super pod {spid!r}: needs a decimal id and a list of nodes")
            self.pods[str(spid)] = [str(n) for n in names]
            for k, n in enumerate(names):
                if str(n) in self.nodes:
                    raise FabricError(f"node {n} in two super pods")
                self.nodes[str(n)] = (str(spid), k + 1, roce_ip(str(spid), k))
        self.by_ip = {ip: n for n, (_, _, ip) in self.nodes.items()}
        self.base_delay_us = float(spec.get("base_delay_us", 12.0))
        self.hop_delay_us = float(spec.get("hop_delay_us", 3.0))
        self.jitter_us = float(spec.get("jitter_us", 1.5))
        self.base_loss = float(spec.get("base_loss", 0.0))
        real = (
            REAL_ROCE_JITTER if spec.get("jitter_model") == "real" else dict.fromkeys(REAL_ROCE_JITTER, 0.0)
        )
        self.noise = {k: float(spec.get(k, real[k])) for k in REAL_ROCE_JITTER}
        self._rng = np.random.default_rng(int(spec.get("seed", 1)))
        self.dead: set[str] = set()
        self.link_loss: dict[frozenset, float] = {}
        self.link_delay: dict[frozenset, float] = {}
        self.uplink: dict[str, tuple[float, float]] = {}
        self.switch = (0.0, 0.0)
        self.faults = list(spec.get("faults") or [])
        for f in self.faults:
            self._add(f)

    def _node(self, n: Any, kind: str) -> str:
        if str(n) not in self.nodes:
            raise FabricError(f"{kind}: no node {n}")
        return str(n)

    def _add(self, f: Any) -> None:
        if not isinstance(f, dict) or f.get("kind") not in ROCE_FAULT_KINDS:
            raise FabricError(f"RoCE fault must be an object with kind in {ROCE_FAULT_KINDS}: {f!r}")
        kind = f["kind"]
        loss = float(f.get("loss", 0.3))
        if not 0 <= loss <= 1:
            raise FabricError(f"{kind}: loss {loss} outside 0..1")
        if kind in ("dead_npu", "dead_node"):
            self.dead.add(self._node(f.get("node"), kind))
        elif kind in ("lossy_link", "slow_link"):
            key = frozenset((self._node(f.get("a"), kind), self._node(f.get("b"), kind)))
            if kind == "lossy_link":
                self.link_loss[key] = loss
            else:
                self.link_delay[key] = float(f.get("delay_us", 50))
        elif kind == "pod_uplink":
            spid = str(f.get("super_pod"))
            if spid not in self.pods:
                raise FabricError(f"pod_uplink: no super pod {spid}")
            self.uplink[spid] = (float(f.get("loss", 0.3)), float(f.get("delay_us", 0)))
        else:
            self.switch = (loss, float(f.get("delay_us", 0)))

    def super_pods(self) -> list[SuperPod]:
        """The super pods' topologies, each node with its ``RoceIP`` (``RocePhyId`` 0)."""
        out = []
        for spid, names in self.pods.items():
            sp = build_super_pod(spid, names, self.npus)
            for n in names:
                sp.nodes[n].roce_ip = self.nodes[n][2]
                sp.nodes[n].roce_phy = 0
            out.append(sp)
        return out

    def _path(self, src: str, dst: str | None, load: dict[str, float], busy: set[str], rounds: int):
        if dst is None or src in self.dead or dst in self.dead:
            return 0.0, 0.0, 0.0
        a, b = self.nodes[src][0], self.nodes[dst][0]
        keep = (1 - self.base_loss) * (1 - self.link_loss.get(frozenset((src, dst)), 0.0))
        d = self.base_delay_us + self.link_delay.get(frozenset((src, dst)), 0.0)
        queue = 0.0
        if a != b:
            d += 2 * self.hop_delay_us
            for pod in (a, b):
                ul, ud = self.uplink.get(pod, (0.0, 0.0))
                keep *= 1 - ul
                d += ud
                queue += load.get(pod, 0.0) / 2
            keep *= 1 - self.switch[0]
            d += self.switch[1]
        if src in busy:
            d += self.noise["host_hiccup_us"] / max(rounds, 1)
        return keep, d, queue

    def probe_many(
        self, probes: list[tuple[str, str]], packets: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One period of ICMP probes (source node, destination IP): succeeded and failed packets and
        the mean RTT of the answered ones (µs, -1 when none answered). An unknown IP never answers."""
        nz = self.noise
        load = {s: nz["load_us"] * max(0.0, 1 + nz["load_cv"] * float(self._rng.normal())) for s in self.pods}
        busy = {
            n for n in self.nodes if nz["host_hiccup_prob"] and self._rng.random() < nz["host_hiccup_prob"]
        }
        rounds = max(1, packets // ROUND_PACKETS)
        n = len(probes)
        keep, base, queue = np.empty(n), np.empty(n), np.empty(n)
        for i, (src, ip) in enumerate(probes):
            keep[i], base[i], queue[i] = self._path(src, self.by_ip.get(ip), load, busy, rounds)
        lost = (
            self._rng.binomial(rounds, nz["burst_prob"], n)
            if nz["burst_prob"]
            else np.zeros(n, dtype=np.int64)
        )
        suc = self._rng.binomial(np.maximum(0, packets - lost * ROUND_PACKETS), keep)
        noise = mean_noise(self._rng, suc, self.jitter_us, queue, nz["tail_prob"], nz["tail_us"])
        return suc, packets - suc, np.where(suc > 0, np.maximum(1.0, base + noise), -1.0)

    def to_json(self) -> str:
        """The spec as JSON text (for the fabric file)."""
        return json.dumps(self.spec, indent=1)
