"""Kubernetes mode, publish: ``cluster-info-device-<i>``, ``cluster-info-switch-<i>``,
``cluster-info-node-cm`` in ``--kube-publish-namespace`` (label ``mx-consumer-volcano=true``).

Built from the fault center, the node registry (agents' device states and node status) and the
consumed device-info documents. Shards are packed in node order (deterministic). A ConfigMap is
written only when its content changed (an entry's ``UpdateTime`` moves only when that entry
changes), at most once per ``--kube-min-write-s``; API errors back off exponentially
(:class:`faultmesh.retry.Backoff`) and the write is retried; every ``--kube-resync-s`` the
published ConfigMaps are read back and rewritten if someone changed them. Shards no longer needed
are written as ``""`` (the reference's behaviour). The publisher is the fault center's ``kube``
subscriber: a change only marks its nodes dirty (resync: a full rebuild).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import orjson

from clusterd.breaker import IsolationBreaker
from clusterd.center import FaultCenter
from clusterd.kube import cluster_info, formats
from clusterd.kube.config import KubeConfig
from clusterd.kube.consumer import NODEINFO_REPORTER
from clusterd.kube.metrics import KubeMetrics
from clusterd.nodes import NodeRegistry
from faultmesh.kube import KubeApi, KubeError
from faultmesh.log import event
from faultmesh.retry import Backoff
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.kube")

VOLCANO_LABEL = ("mx-consumer-volcano", "true")
MANAGED_BY = ("app.kubernetes.io/managed-by", "faultmesh-clusterd")


def _isolates(entries: dict[str, dict]) -> bool:
    """Do a node's cluster-info entries take capacity away: an NPU in an ``-Unhealthy`` list, or the
    node's status UnHealthy (what Volcano schedules by)?"""
    dev = entries.get("device")
    if dev is not None and any(k.endswith("-Unhealthy") and v for k, v in dev.get("DeviceList", {}).items()):
        return True
    node = entries.get("node")
    return node is not None and node.get("NodeStatus") == "UnHealthy"


HA_HOLDOFF_S = 15.0  # a new leader: the agents reconnect within their 10 s backoff cap


def publish_holdoff_s(holdoff_s: float, leader_elect: bool) -> float:
    """``--kube-publish-holdoff-s`` (``holdoff_s``) resolved (s): -1 means 15 with leader election
    on (``leader_elect``: ``--kube-leader-elect on``), else 0.

    A new leader (issue 15 HA) starts from the state ConfigMap without the agents' faults; publishing
    at once would tell Volcano that every node is healthy until their snapshots arrive."""
    if holdoff_s >= 0:
        return float(holdoff_s)
    return HA_HOLDOFF_S if leader_elect else 0.0


def _shard_order(name: str) -> tuple[str, int]:
    """``cluster-info-device-10`` after ``-9``: shards are written in numeric order, so a node moving
    to an earlier shard is never missing in between (it may briefly appear twice)."""
    prefix, _, tail = name.rpartition("-")
    return (prefix, int(tail)) if tail.isdigit() else (name, -1)


class ClusterInfoPublisher:
    """See the module docstring. ``api`` is set by the component once connected; ``after_publish``
    is called after every successful round (the annotator's trigger)."""

    def __init__(
        self,
        cfg: KubeConfig,
        center: FaultCenter,
        nodes: NodeRegistry,
        device_docs: dict[str, formats.DeviceInfoDoc],
        metrics: KubeMetrics,
        after_publish: Callable[[], None],
        breaker: IsolationBreaker | None = None,
    ) -> None:
        """``breaker``: asked before a node is newly published as isolated (:mod:`clusterd.breaker`)."""
        self.cfg = cfg
        self.breaker = breaker
        self.center = center
        self.nodes = nodes
        self.device_docs = device_docs
        self.metrics = metrics
        self.after_publish = after_publish
        self.api: KubeApi | None = None
        self._dirty = asyncio.Event()
        self.held = False  # True during the start-up hold-off (see :func:`publish_holdoff_s`)
        self._written: dict[str, str] = {}  # published ConfigMap name -> data value last written/read
        self._entries: dict[str, dict] = {}  # entry key (CmName) -> last published entry (with UpdateTime)
        # kind (device / switch / node) -> node -> (entry key, serialized entry): rebuilt per changed node
        self._parts: dict[str, dict[str, tuple[str, str]]] = {"device": {}, "switch": {}, "node": {}}
        self._dirty_nodes: set[str] = set()
        self._full_refresh = True
        self._last_resync = 0.0

    # -- change intake ---------------------------------------------------------------------------
    def mark(self, node: str) -> None:
        """``node``'s entries need a rebuild."""
        self._dirty_nodes.add(node)
        self._dirty.set()

    def on_changes(self, changes) -> None:
        """The fault-center subscription: mark the changed nodes."""
        for c in changes:
            self._dirty_nodes.add(c.fault.node)
        self._dirty.set()

    def on_resync(self, faults) -> None:
        """The subscription fell behind: rebuild every node."""
        self._full_refresh = True
        self._dirty.set()

    # -- building --------------------------------------------------------------------------------
    def _stamp(self, key: str, entry: dict, now_s: int) -> dict:
        """``entry`` with UpdateTime: kept from the last publication when nothing else changed."""
        old = self._entries.get(key)
        if old is not None and {k: v for k, v in old.items() if k != "UpdateTime"} == entry:
            t = old.get("UpdateTime", now_s)
        else:
            t = now_s
        out = dict(entry)
        out["UpdateTime"] = t
        self._entries[key] = out
        return out

    def _rebuild_node(self, node: str, faults: list, now_s: int) -> None:
        """Recompute the three cluster-info entries of ``node`` into the per-kind caches."""
        type_name = self.cfg.kube_device_type
        npu, switch, node_faults = [], [], []
        for f in faults:
            if f.device_type in ("NPU", type_name) or f.source.startswith("public:"):
                npu.append(f)
            elif f.device_type == "Switch":
                switch.append(f)
            else:
                node_faults.append(f)
        st = self.nodes.get(node)
        devs = [
            d for d in (st.devices.values() if st else ()) if d.get("device_type") in ("NPU", type_name, "")
        ]
        doc = self.device_docs.get(node)
        agent_status = self.nodes.status(node, prefer=NODEINFO_REPORTER)
        present = {
            "device": bool(npu or doc or devs),
            "switch": bool(switch or (doc and doc.switch_info)),
            "node": bool(node_faults or agent_status not in ("", "Healthy")),
        }
        built: dict[str, dict] = {}
        for kind in self._parts:
            if not present[kind]:
                continue
            if kind == "device":
                built[kind] = cluster_info.build_device_entry(node, type_name, npu, devs, doc)
            elif kind == "switch":
                built[kind] = cluster_info.build_switch_entry(node, switch, doc.switch_info if doc else None)
            else:
                built[kind] = cluster_info.build_node_entry(node, node_faults, agent_status)
        if self.breaker is not None and self.breaker.enabled:
            before = {k: e for k, b in built.items() if (e := self._entries.get(b["CmName"])) is not None}
            if not _isolates(built):
                self.breaker.forget(node)
            elif _isolates(before):
                self.breaker.adopt(node)  # published isolated already (before a restart too)
            elif not self.breaker.admit(node, "cluster-info"):
                return  # held (clusterd.breaker): Volcano keeps seeing what was published before
        for kind, cache in self._parts.items():
            entry = built.get(kind)
            if entry is None:
                if node in cache:
                    self._entries.pop(cache.pop(node)[0], None)
                continue
            key = entry["CmName"]
            cache[node] = (key, cluster_info.entry_part(key, self._stamp(key, entry, now_s)))

    def on_breaker_release(self, nodes: list[str]) -> None:
        """The isolation breaker was released: publish the nodes it held."""
        for node in nodes:
            self.mark(node)

    async def refresh(self, full: bool = False) -> None:
        """Recompute the entries of the nodes that changed (all nodes when ``full``), yielding to the
        loop every 256 nodes so a 16k-node rebuild never stalls ingest."""
        nodes = set(self._dirty_nodes)
        self._dirty_nodes.clear()
        if full:
            nodes |= self.center.node_names() | set(self.device_docs) | self.nodes.names()
            for cache in self._parts.values():
                nodes |= set(cache)
        now_s = int(time.time())
        for i, node in enumerate(sorted(nodes)):
            self._rebuild_node(node, self.center.faults_of_node(node), now_s)
            if i % 256 == 255:
                await asyncio.sleep(0)

    def desired(self) -> dict[str, str]:
        """ConfigMap name -> data value of everything Kubernetes mode publishes (from the caches)."""
        a = self.cfg
        out: dict[str, str] = {}
        for prefix, kind in ((formats.DEVICE_CM_PREFIX, "device"), (formats.SWITCH_CM_PREFIX, "switch")):
            parts = list(self._parts[kind].values())
            shards = cluster_info.shard_parts(parts, a.kube_shard_bytes) or [""]
            for i, data in enumerate(shards):
                out[f"{prefix}{i}"] = data
            self.metrics.shards.labels(prefix.rstrip("-")).set(len(shards) if parts else 0)
        parts = list(self._parts["node"].values())
        out[formats.NODE_CM_NAME] = cluster_info.shard_parts(parts, 1 << 62)[0] if parts else ""
        # Surplus shards from earlier rounds (or an earlier process) are emptied, not deleted.
        for name in self._written:
            if name not in out:
                out[name] = ""
        return out

    # -- writing ---------------------------------------------------------------------------------
    async def _seed(self) -> None:
        """Read what is already published (a restart must not rewrite unchanged ConfigMaps)."""
        assert self.api is not None
        ns = self.cfg.kube_publish_namespace
        items, _ = await self.api.list_config_maps(ns, "=".join(VOLCANO_LABEL))
        for cm in items:
            name = (cm.get("metadata") or {}).get("name", "")
            if not (
                name.startswith((formats.DEVICE_CM_PREFIX, formats.SWITCH_CM_PREFIX))
                or name == formats.NODE_CM_NAME
            ):
                continue
            value = (cm.get("data") or {}).get(name)
            if value is None:
                continue
            self._written[name] = value
            if value:
                try:
                    for k, v in orjson.loads(value).items():
                        if isinstance(v, dict):
                            self._entries[k] = v
                except (orjson.JSONDecodeError, AttributeError):
                    pass

    async def _write(self, name: str, value: str) -> None:
        assert self.api is not None
        ns = self.cfg.kube_publish_namespace
        await self.api.upsert_config_map(ns, name, {name: value}, dict([VOLCANO_LABEL, MANAGED_BY]))
        self._written[name] = value

    async def _resync(self) -> None:
        """Forget what differs on the server (edited or deleted by someone), so it is rewritten, and
        rebuild every entry once (device states that changed without a fault change)."""
        assert self.api is not None
        self._full_refresh = True
        ns = self.cfg.kube_publish_namespace
        items, _ = await self.api.list_config_maps(ns, "=".join(VOLCANO_LABEL))
        live = {(cm.get("metadata") or {}).get("name", ""): (cm.get("data") or {}) for cm in items}
        for name in list(self._written):
            if live.get(name, {}).get(name) != self._written[name]:
                del self._written[name]

    async def publish_once(self) -> int:
        """Write every changed ConfigMap. Returns how many were written. Raises :class:`KubeError`."""
        full, self._full_refresh = self._full_refresh, False
        await self.refresh(full=full)
        desired = self.desired()
        n = 0
        for name in sorted(desired, key=_shard_order):
            if self._written.get(name) == desired[name]:
                continue
            try:
                await self._write(name, desired[name])
            except KubeError as e:
                self.metrics.writes.labels("configmap", "error").inc()
                self.metrics.api_errors.labels(e.op, str(e.status)).inc()
                raise
            self.metrics.writes.labels("configmap", "ok").inc()
            n += 1
        self.after_publish()
        return n

    def _failed(self, e: KubeError, backoff: Backoff) -> float:
        delay = backoff.next_delay()
        event(log, logging.WARNING, "kube publish failed, retrying", error=str(e), retry_s=round(delay, 2))
        return delay

    async def run(self) -> None:
        """Seed, then publish on every change (at most once per ``--kube-min-write-s``) until cancelled."""
        a = self.cfg
        backoff = Backoff(0.2, 30.0)
        while True:
            try:
                await self._seed()
                break
            except KubeError as e:
                self.metrics.api_errors.labels(e.op, str(e.status)).inc()
                await asyncio.sleep(self._failed(e, backoff))
        holdoff = publish_holdoff_s(a.kube_publish_holdoff_s, a.leader_elect)
        if (
            holdoff > 0
        ):  # the ConfigMaps on the server stay (the last leader's view) until the agents are back
            self.held = True
            event(log, logging.INFO, "cluster info publish held off", seconds=holdoff)
            await asyncio.sleep(holdoff)
            self.held = False
        self._last_resync = time.monotonic()
        self._dirty.set()
        while True:
            try:
                await wait_for(self._dirty.wait(), max(0.05, a.kube_resync_s))
            except TimeoutError:
                pass
            self._dirty.clear()
            try:
                if time.monotonic() - self._last_resync >= a.kube_resync_s:
                    await self._resync()
                    self._last_resync = time.monotonic()
                n = await self.publish_once()
                if n:
                    event(log, logging.DEBUG, "cluster info published", configmaps=n)
                backoff.reset()
            except KubeError as e:
                self._dirty.set()  # retry the same content after the backoff
                await asyncio.sleep(self._failed(e, backoff))
                continue
            await asyncio.sleep(a.kube_min_write_s)
