"""Kubernetes mode, the ``super-pod-<id>`` ConfigMaps: the pingmesh topology of each super pod
(issue 32 item 6).

Source: the reference ClusterD's pingmesh publisher (``component/clusterd/pkg/application/pingmesh/
publisher.go``, its super-pod store ``pkg/domain/superpod``; reference clusterd.md §6 "Other CMs
ClusterD writes"). What a reader sees is the reference's:

- name ``super-pod-<SuperPodID>``, namespace ``cluster-system``, label ``app=pingmesh``;
- data key ``superPodDevice`` = Go's ``json.Marshal`` of ``SuperPodDevice``: compact JSON
  ``{"Version", "SuperPodID", "NodeDeviceMap": {<node>: {"NodeName", "ServerID", "DeviceMap":
  {"<phy id>": "<SDID>"}}}}``, every value a decimal string, map keys in Go's order (sorted as
  strings); ``Version`` is the server type, ``A3`` for a super pod;
- written while the pingmesh feature is on (the reference's ``RasNetDetectInst.CheckIsOn()``: some
  entry of ``pingmesh-config`` has ``activate: on``), only when a super pod's document changed
  (the reference's check code), and deleted when its last node is gone; a failed write is retried
  on the next round (the reference keeps failed tasks in its event map), with an exponential backoff
  (:class:`faultmesh.retry.Backoff`) and counted in ``faultmesh_kube_writes_total{kind="superpod",
  result="error"}`` and ``faultmesh_kube_api_errors_total``.

Built from what clusterd already holds, per node:

- the Node object (clusterd's node watch), when the reference device plugin annotated it, as the
  reference reads it (``pkg/domain/node``): super pod id from the label
  ``huawei.com/topotree.superpodid`` else the annotation ``superPodID``, server id from
  ``huawei.com/topotree.serverid`` else ``serverIndex``, and the SDIDs from
  ``huawei.com/npu.base-device-infos`` else ``baseDeviceInfos`` (``{"Ascend910-<phy>": {"IP",
  "SuperDeviceID"}}``; a name that is not ``Ascend910-<int>`` drops the node, as there);
- else the agents' device states in the node registry (deviced's ``super_pod_id``, ``server_index``
  and ``phy_id`` per chip, deviced.md §5.1; a node counts when all its chips name one super pod id
  >= 0 and one server index >= 0). deviced's states carry no SDID, so the SDID is the A3 layout's
  (:func:`fdol.slownet.topology.make_sdid`, checked against the reference docs' example super pod) —
  docs/compatibility.md says so.

One difference on purpose: a ``super-pod-<id>`` ConfigMap this writer did not create (an operator's,
with faultmesh's ``Planes`` or real SDIDs) is left as it is, logged once and counted
(``result="foreign"``); the writer marks its own with ``app.kubernetes.io/managed-by:
faultmesh-clusterd``. With leader election only the leader runs the writer (:mod:`.leader`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from clusterd.kube.metrics import KubeMetrics
from clusterd.nodes import NodeRegistry
from faultmesh.kube import KubeApi, KubeError
from faultmesh.log import event
from faultmesh.retry import Backoff
from fdol.slownet.topology import make_sdid

log = logging.getLogger("clusterd.kube")

NAMESPACE = "cluster-system"
PREFIX = "super-pod-"
DATA_KEY = "superPodDevice"
LABELS = {"app": "pingmesh"}
MANAGED_BY = ("app.kubernetes.io/managed-by", "faultmesh-clusterd")
VERSION_A3 = "A3"
MAX_NODES_PER_SUPER_POD = 256  # the reference's store refuses more (superpod_storage.go)
PERIOD_S = 5.0  # the reference checks its event map every 5 s


def node_placement(devices: list[dict[str, Any]]) -> tuple[int, int, dict[int, int]] | None:
    """(super pod id, server index, phy id -> SDID) of one node from its device views (``super_pod_id``,
    ``server_index``, ``phy_id``), or None when the node is in no super pod, its chips disagree or a
    value is out of range."""
    pairs: set[tuple[int, int]] = set()
    phys: list[int] = []
    for d in devices:
        try:
            spid, idx, phy = int(d.get("super_pod_id", -1)), int(d.get("server_index", -1)), int(d["phy_id"])
        except (KeyError, TypeError, ValueError):
            return None
        pairs.add((spid, idx))
        phys.append(phy)
    if len(pairs) != 1:
        return None
    ((spid, idx),) = pairs
    if spid < 0 or idx < 0:
        return None
    try:
        return spid, idx, {p: make_sdid(idx, p) for p in phys}
    except ValueError:
        return None


SUPER_POD_LABEL, SUPER_POD_ANNOTATION = "huawei.com/topotree.superpodid", "superPodID"
SERVER_LABEL, SERVER_ANNOTATION = "huawei.com/topotree.serverid", "serverIndex"
BASE_INFOS = ("huawei.com/npu.base-device-infos", "baseDeviceInfos")
CHIP_PREFIX = "Ascend910-"
MAX_NODE_DEVICES = 128  # the reference drops a node whose base-device-infos has more


def node_object_placement(obj: dict[str, Any]) -> tuple[int, int, dict[int, int]] | None:
    """(super pod id, server index, phy id -> SDID) from a Node object the reference device plugin
    annotated (module doc), or None when it carries no usable placement."""
    meta = obj.get("metadata") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
    raw = next((ann[k] for k in BASE_INFOS if ann.get(k)), None)
    try:
        spid = int(str(labels.get(SUPER_POD_LABEL) or ann.get(SUPER_POD_ANNOTATION) or "").strip())
        idx = int(str(labels.get(SERVER_LABEL) or ann.get(SERVER_ANNOTATION) or "").strip())
        infos = json.loads(raw) if raw else None
        if spid < 0 or idx < 0 or not isinstance(infos, dict) or not 0 < len(infos) <= MAX_NODE_DEVICES:
            return None
        devs: dict[int, int] = {}
        for name, info in infos.items():
            phy = int(name.removeprefix(CHIP_PREFIX)) if name.startswith(CHIP_PREFIX) else None
            sdid = (info or {}).get("SuperDeviceID") if isinstance(info, dict) else None
            if phy is None or phy < 0 or isinstance(sdid, bool) or not isinstance(sdid, int) or sdid < 0:
                return None
            devs[phy] = sdid
        return spid, idx, devs
    except (TypeError, ValueError):
        return None


def super_pod_device(spid: int, nodes: dict[str, tuple[int, dict[int, int]]]) -> dict[str, Any]:
    """The reference's ``SuperPodDevice`` of one super pod, keys in Go's ``json.Marshal`` order.
    ``nodes``: node name -> (server index, phy id -> SDID)."""
    return {
        "Version": VERSION_A3,
        "SuperPodID": str(spid),
        "NodeDeviceMap": {
            name: {
                "NodeName": name,
                "ServerID": str(idx),
                "DeviceMap": {k: v for k, v in sorted((str(p), str(s)) for p, s in devs.items())},
            }
            for name, (idx, devs) in sorted(nodes.items())
        },
    }


def desired_documents(registry: NodeRegistry, node_objects: dict[str, dict] | None = None) -> dict[str, str]:
    """ConfigMap name -> ``superPodDevice`` value for every super pod the Node objects (name ->
    object) or the agents report (module doc)."""
    pods: dict[int, dict[str, tuple[int, dict[int, int]]]] = {}
    objs = node_objects or {}
    for name in sorted(registry.names() | set(objs)):
        where = node_object_placement(objs[name]) if name in objs else None
        if where is None:
            st = registry.get(name)
            views = [d for d in (st.devices.values() if st else ()) if d.get("phy_id") is not None]
            where = node_placement(views) if views else None
        if where is None:
            continue
        spid, idx, devs = where
        members = pods.setdefault(spid, {})
        if len(members) < MAX_NODES_PER_SUPER_POD:
            members[name] = (idx, devs)
    return {
        f"{PREFIX}{spid}": json.dumps(super_pod_device(spid, members), separators=(",", ":"))
        for spid, members in pods.items()
    }


class SuperPodPublisher:
    """Writes the ``super-pod-<id>`` ConfigMaps (module doc). ``api`` is set by the Kubernetes component
    once connected; ``pingmesh_on()`` says whether the pingmesh feature is on (None: always);
    ``node_objects()``: node name -> Node object.
    :meth:`run` is a leader-only writer; :meth:`publish_once` is one round (tests)."""

    def __init__(
        self,
        nodes: NodeRegistry,
        metrics: KubeMetrics,
        pingmesh_on: Callable[[], bool] | None = None,
        period_s: float = PERIOD_S,
        node_objects: Callable[[], dict[str, dict]] = dict,
    ) -> None:
        self.nodes = nodes
        self.node_objects = node_objects  # name -> Node object (the kube component's node watch)
        self.metrics = metrics
        self.pingmesh_on = pingmesh_on
        self.period_s = period_s
        self.api: KubeApi | None = None
        self.written: dict[str, str] = {}  # name -> value last written (the reference's check code)
        self.foreign: set[str] = set()  # names someone else owns: left alone

    def _count(self, result: str, e: KubeError | None = None) -> None:
        self.metrics.writes.labels("superpod", result).inc()
        if e is not None:
            self.metrics.api_errors.labels(e.op, str(e.status)).inc()

    async def _owned(self, name: str) -> bool:
        """May this writer write ``name``: absent, or marked as ours. Raises :class:`KubeError`."""
        assert self.api is not None
        try:
            obj = await self.api.get_config_map(NAMESPACE, name)
        except KubeError as e:
            if e.status == 404:
                return True
            raise
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY[0]) == MANAGED_BY[1]:
            self.written[name] = ((obj.get("data") or {}).get(DATA_KEY)) or ""
            return True
        if name not in self.foreign:
            self.foreign.add(name)
            self._count("foreign")
            event(log, logging.WARNING, "super-pod configmap not ours, left alone", name=name)
        return False

    async def publish_once(self) -> int:
        """Write the changed super pods, delete the gone ones. Returns how many ConfigMaps changed;
        raises the first :class:`KubeError` after trying every super pod (the rest are retried)."""
        assert self.api is not None
        if self.pingmesh_on is not None and not self.pingmesh_on():
            return 0
        want = desired_documents(self.nodes, self.node_objects())
        n, first = 0, None
        for name in sorted(want):
            if name in self.foreign or self.written.get(name) == want[name]:
                continue
            try:
                if name not in self.written and not await self._owned(name):
                    continue
                if self.written.get(name) == want[name]:
                    continue
                await self.api.upsert_config_map(
                    NAMESPACE, name, {DATA_KEY: want[name]}, {**LABELS, **dict([MANAGED_BY])}
                )
            except KubeError as e:
                self.written.pop(name, None)
                self._count("error", e)
                first = first or e
                continue
            self.written[name] = want[name]
            self._count("ok")
            event(
                log,
                logging.INFO,
                "super-pod configmap written",
                name=name,
                nodes=want[name].count('"NodeName"'),
            )
            n += 1
        for name in sorted(set(self.written) - set(want)):
            try:
                await self.api.delete_config_map(NAMESPACE, name)
            except KubeError as e:
                if e.status != 404:
                    self._count("error", e)
                    first = first or e
                    continue
            del self.written[name]
            self._count("deleted")
            event(log, logging.INFO, "super-pod configmap deleted", name=name)
            n += 1
        if first is not None:
            raise first
        return n

    async def seed(self) -> None:
        """Learn which ``super-pod-*`` ConfigMaps on the server are this writer's (an earlier term's or
        another replica's), so a super pod gone meanwhile is deleted. Raises :class:`KubeError`."""
        assert self.api is not None
        items, _ = await self.api.list_config_maps(NAMESPACE, "=".join(next(iter(LABELS.items()))))
        self.written.clear()
        self.foreign.clear()
        for cm in items:
            meta = cm.get("metadata") or {}
            name = str(meta.get("name") or "")
            if name.startswith(PREFIX) and (meta.get("labels") or {}).get(MANAGED_BY[0]) == MANAGED_BY[1]:
                self.written[name] = str((cm.get("data") or {}).get(DATA_KEY) or "")

    async def run(self) -> None:
        """Seed, then publish every ``period_s`` until cancelled; a failure is retried with a backoff."""
        backoff = Backoff(0.5, 30.0)
        seeded = False
        while True:
            try:
                if not seeded:
                    await self.seed()
                    seeded = True
                await self.publish_once()
                backoff.reset()
                delay = self.period_s
            except KubeError as e:
                delay = backoff.next_delay()
                event(
                    log,
                    logging.WARNING,
                    "super-pod publish failed, retrying",
                    error=str(e),
                    retry_s=round(delay, 2),
                )
            await asyncio.sleep(delay)
