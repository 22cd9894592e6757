"""Slow-network detection in Kubernetes mode: the pingmesh control ConfigMaps (issue 15).

Source: reference noded.md §6. Read (namespace ``cluster-system``, label ``app=pingmesh``, adds and
updates only — a deleted ConfigMap leaves the last config in force, as in the reference):

- ``pingmesh-config``: each data value a JSON string ``{"activate": "on"|"off", "task_interval":
  1..60}`` under the key ``global``, a super-pod id or ``roce``
  (:func:`fdol.slownet.config.parse_config`) -> :meth:`clusterd.slownet.SlowNetComponent.set_config`;
- ``super-pod-<id>``: data key ``superPodDevice`` = the ``SuperPodDevice`` JSON
  (:func:`fdol.slownet.topology.parse_super_pod`) -> ``set_topology``.

A bad ConfigMap (truncated JSON, an unknown key, a value out of range, more than
``MAX_DATA_BYTES`` of data, a ``super-pod-<id>`` whose SuperPodID is another id) is logged, counted
in ``faultmesh_slownet_inputs_rejected_total{kind="configmap"}`` and ignored: the last good input
stays.

Written: ``pingmesh-fault-<node>`` (same namespace, label ``mc-consumer-publicfault: "true"``,
data key ``PublicFault``), the document of the reference's card analyser: ``{id (uuid v1),
timestamp (ms), version "1.0", resource "pingmesh", faults: [{faultId = sha256hex("<node>/<phy>"),
faultType "NPU", faultCode "220001001", faultTime (ms), assertion "occur"|"recover", faultLocation
{}, influence: [{nodeName, nodeSN "", deviceIds: [phy]}], description "hccsping-mesh fault"}]}`` for
the cards no destination answers (fault code 220001001 of clusterd's slownet faults). A new card is
written ``occur``; a card that answers again is written ``recover`` once and dropped on the next
change; a node's ConfigMap is written only when its document changes, and only by the leader when
leader election is on (``--kube-leader-elect on``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from faultmesh.kube import KubeApi, KubeError, make_api_client
from faultmesh.kubewatch import ListWatcher
from faultmesh.log import event
from faultmesh.model import Fault
from fdol.slownet import config as pmconfig
from fdol.slownet import topology as topo

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from prometheus_client import Counter

    from clusterd.kube.config import KubeConfig
    from clusterd.kube.leader import Election
    from clusterd.kube.metrics import KubeMetrics
    from fdol.slownet.topology import SuperPod

log = logging.getLogger("clusterd.slownet")

NAMESPACE = "cluster-system"
SELECTOR = "app=pingmesh"
CONFIG_NAME = "pingmesh-config"
TOPOLOGY_PREFIX = "super-pod-"
FAULT_PREFIX = "pingmesh-fault-"
FAULT_LABELS = {"mc-consumer-publicfault": "true"}
CARD_CODE = "220001001"
MAX_DATA_BYTES = 512 << 10  # a 384 x 16-NPU super-pod ConfigMap is ~200 KiB


def public_fault_doc(node: str, cards: dict[int, tuple[str, int]], now_ms: int) -> dict[str, Any]:
    """The ``PublicFault`` document of ``node`` (module doc): ``cards`` phy id -> (assertion, fault
    time ms)."""
    return {
        "id": str(uuid.uuid1()),
        "timestamp": now_ms,
        "version": "1.0",
        "resource": "pingmesh",
        "faults": [
            {
                "faultId": hashlib.sha256(f"{node}/{phy}".encode()).hexdigest(),
                "faultType": "NPU",
                "faultCode": CARD_CODE,
                "faultTime": t,
                "assertion": assertion,
                "faultLocation": {},
                "influence": [{"nodeName": node, "nodeSN": "", "deviceIds": [phy]}],
                "description": "hccsping-mesh fault",
            }
            for phy, (assertion, t) in sorted(cards.items())
        ],
    }


class PingmeshConfigMaps:
    """The ConfigMap side of the slow-network component (module doc). ``start()`` opens the API
    (``--kube-api`` / ``--kubeconfig``) and watches; ``sync_faults()`` after each analysis writes the
    ``pingmesh-fault-<node>`` ConfigMaps; ``stop()`` closes the client (the watch task is owned by the
    component's task owner)."""

    def __init__(
        self,
        cfg: KubeConfig,
        spawn: Callable[..., asyncio.Task],
        set_config: Callable[[dict[str, pmconfig.Activation], str], Awaitable[None]],
        set_topology: Callable[[SuperPod, str], Awaitable[None]],
        rejected: Counter,
        election: Election | None = None,
        metrics: KubeMetrics | None = None,
    ) -> None:
        """``cfg``: the Kubernetes mode's section (the API: ``--kube-api`` / ``--kubeconfig`` /
        ``--kube-timeout-s``); ``spawn``: the task owner's; ``set_config`` / ``set_topology``: apply
        a ConfigMap's input (``ValueError``: refused, counted in ``rejected{kind=configmap}``);
        ``election``: the replica's Lease election (with leader election on, only the leader
        writes); ``metrics``: the Kubernetes component's watch metrics (None: not counted)."""
        self.cfg = cfg
        self._spawn = spawn
        self._set_config = set_config
        self._set_topology = set_topology
        self._rejected = rejected
        self.election = election
        self.metrics = metrics
        self.api: KubeApi | None = None
        self._client = None
        self.watch: ListWatcher | None = None
        self.cards: dict[str, dict[int, tuple[str, int]]] = {}  # node -> phy -> (assertion, ms)
        self.written: dict[str, str] = {}  # node -> faults JSON last written (id/timestamp aside)
        self._watch_task: asyncio.Task | None = None

    async def start(self) -> None:
        """Open the API client and start the watch (raises ``OSError`` without a configuration)."""
        a = self.cfg
        self._client = await make_api_client(a.kube_api, a.kubeconfig)
        self.api = KubeApi(self._client, timeout_s=a.kube_timeout_s)
        m = self.metrics
        self.watch = ListWatcher(
            self.api, "configmaps", NAMESPACE, SELECTOR, self._on_cm, self._accept,
            on_error=(lambda e: m.api_errors.labels("watch pingmesh", str(e.status)).inc()) if m else None,
            on_restart=(lambda why: m.restarts.labels("pingmesh", why).inc()) if m else None,
        )  # fmt: skip
        self._watch_task = self._spawn(self.watch.run(), name="slownet-configmaps")

    async def stop(self) -> None:
        """Stop the watch (bounded, 5 s), then close the API client (a watch still running on a
        closed client failed with an AssertionError at every clusterd stop)."""
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=5.0)
        if self._client is not None:
            await self._client.close()
            self._client = None

    @staticmethod
    def _accept(obj: dict) -> bool:
        name = str((obj.get("metadata") or {}).get("name") or "")
        return name == CONFIG_NAME or name.startswith(TOPOLOGY_PREFIX)

    def _reject(self, name: str, error: str) -> None:
        self._rejected.labels("configmap").inc()
        event(log, logging.WARNING, "slownet input rejected", kind="configmap", configmap=name, error=error)

    async def _on_cm(self, op: str, obj: dict) -> None:
        if op != "upsert":
            return  # the reference ignores deletes: the last config stays
        name = str(obj["metadata"].get("name"))
        data = obj.get("data") or {}
        try:
            if not isinstance(data, dict):
                raise ValueError("data must be a map")
            size = sum(len(str(k)) + len(str(v)) for k, v in data.items())
            if size > MAX_DATA_BYTES:
                raise ValueError(f"data of {size} bytes (more than {MAX_DATA_BYTES})")
            if name == CONFIG_NAME:
                await self._set_config(pmconfig.parse_config(data), f"configmap:{name}")
            else:
                spid = name[len(TOPOLOGY_PREFIX) :]
                if "superPodDevice" not in data:
                    raise ValueError("no superPodDevice key")
                sp = topo.parse_super_pod(data["superPodDevice"])
                if sp.super_pod_id != spid:
                    raise ValueError(f"SuperPodID {sp.super_pod_id} in ConfigMap {name}")
                await self._set_topology(sp, f"configmap:{name}")
        except ValueError as e:
            self._reject(name, str(e)[:300])

    async def sync_faults(self, current: dict[Any, Fault]) -> None:
        """Write ``pingmesh-fault-<node>`` for the nodes whose unreachable cards changed."""
        if self.api is None:
            return
        if self.election is not None and self.election.following():
            self.written.clear()  # a new leader rewrites what it holds
            return
        now_ms = time.time_ns() // 1_000_000
        live: dict[str, dict[int, int]] = {}
        for f in current.values():
            if f.code == CARD_CODE and f.device_type == "NPU":
                live.setdefault(f.node, {})[int(f.device_id)] = int(f.first_seen_ms)
        for node in sorted(set(live) | set(self.cards)):
            old = self.cards.get(node, {})
            new = {phy: ("occur", t) for phy, t in live.get(node, {}).items()}
            for phy, (assertion, _t) in old.items():
                if phy not in new and assertion == "occur":
                    new[phy] = ("recover", now_ms)  # written once, dropped on the next change
            body = json.dumps(sorted(new.items()))
            if body == self.written.get(node):
                continue
            doc = public_fault_doc(node, new, now_ms)
            try:
                await self.api.upsert_config_map(
                    NAMESPACE, FAULT_PREFIX + node, {"PublicFault": json.dumps(doc)}, FAULT_LABELS
                )
            except KubeError as e:
                self._rejected.labels("configmap_write").inc()
                event(log, logging.WARNING, "pingmesh fault configmap not written", node=node, error=str(e))
                continue
            self.written[node] = body
            self.cards[node] = {p: v for p, v in new.items() if v[0] == "occur"}
