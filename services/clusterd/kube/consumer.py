"""Kubernetes mode, consume: the reference agents' ConfigMaps and public-fault ConfigMaps.

- ``mindx-dl-nodeinfo-<node>`` and ``mindx-dl-deviceinfo-<node>`` (label ``mx-consumer-cim=true``)
  with the CheckCode verified (Go-compatible JSON, :mod:`faultmesh.gojson`); their faults enter the fault
  center as sources ``kube:nodeinfo`` / ``kube:deviceinfo`` (a deleted ConfigMap clears them); a
  node info's ``NodeStatus`` goes to the node registry as reporter ``kube:nodeinfo``. A bad
  CheckCode, bad JSON or a node that is not a Kubernetes Node is rejected with a log line and
  ``faultmesh_rejected_requests_total{service="kube",reason}``; a ConfigMap of an unknown node is
  applied when that Node appears.
- public faults from ConfigMaps labelled ``mc-consumer-publicfault=true`` (key ``PublicFault``),
  given to the PubFault intake (:meth:`clusterd.api.pubfault.PubFaultComponent.intake`) exactly
  like ``SendPublicFault``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from clusterd.center import FaultCenter
from clusterd.kube import formats
from clusterd.kube.metrics import KubeMetrics
from clusterd.nodes import NodeRegistry
from faultmesh._pb import pubfault_pb2
from faultmesh.kubewatch import ListWatcher
from faultmesh.log import event
from faultmesh.model import now_ms
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.kube")

CIM_LABEL = ("mx-consumer-cim", "true")
PUBLIC_FAULT_LABEL = ("mc-consumer-publicfault", "true")
NODEINFO_REPORTER = "kube:nodeinfo"

PublicFaultIntake = Callable[[pubfault_pb2.PublicFaultRequest], Awaitable[pubfault_pb2.RespStatus]]


def labels(obj: dict) -> dict:
    """The object's ``metadata.labels`` ({} when absent)."""
    return (obj.get("metadata") or {}).get("labels") or {}


def has_label(obj: dict, label: tuple[str, str]) -> bool:
    """True when the object carries ``label`` = (key, value)."""
    return labels(obj).get(label[0]) == label[1]


class KubeConsumer:
    """Consumes node-info, device-info and public-fault ConfigMaps (see the module docstring).

    ``sync_timeout_s``: how long a watcher's first list may take (s; the component passes 3 x
    ``--kube-timeout-s``). ``mark(node)`` tells the publisher that a node's entries need a rebuild. ``node_watch`` (set by
    the component at start) is the Nodes watcher that says which nodes exist.
    """

    def __init__(
        self,
        sync_timeout_s: float,
        center: FaultCenter,
        nodes: NodeRegistry,
        metrics: KubeMetrics,
        public_faults: PublicFaultIntake | None,
        mark: Callable[[str], None],
    ) -> None:
        self.sync_timeout_s = sync_timeout_s  # a watcher's first list must end within (s)
        self.center = center
        self.nodes = nodes
        self.metrics = metrics
        self.public_faults = public_faults
        self.mark = mark
        self.node_watch: ListWatcher | None = None
        self.device_docs: dict[str, formats.DeviceInfoDoc] = {}  # node -> consumed device info
        self._node_status: dict[str, str] = {}  # node -> NodeStatus from consumed node info
        self._pending: dict[tuple[str, str], dict] = {}  # CMs of nodes not (yet) known, by (kind, node)
        self._public_seen: dict[tuple[str, str], bytes] = {}

    def known_node(self, node: str) -> bool:
        """True when ``node`` is a Kubernetes Node (by the Nodes watch)."""
        return self.node_watch is not None and ("", node) in self.node_watch.objects

    async def node_added(self, node: str) -> None:
        """A Node appeared: apply the ConfigMaps that waited for it."""
        for kind in ("nodeinfo", "deviceinfo"):
            cm = self._pending.pop((kind, node), None)
            if cm is not None:
                await (self.on_nodeinfo if kind == "nodeinfo" else self.on_deviceinfo)("upsert", cm)

    async def _wait_nodes(self) -> None:
        w = self.node_watch
        if w is not None and not w.synced.is_set():
            try:
                await wait_for(w.synced.wait(), self.sync_timeout_s)
            except TimeoutError:
                pass

    async def on_nodeinfo(self, op: str, cm: dict) -> None:
        """Watch handler of node-info ConfigMaps."""

        def parse(node: str, data):
            doc = formats.parse_node_info(data)
            return doc.info["NodeStatus"], formats.faults_from_node_info(node, doc, now_ms())

        await self._consume(
            "nodeinfo", "node info", formats.NODEINFO_PREFIX, formats.SOURCE_NODEINFO, self._node_status, parse,
            op, cm,
        )  # fmt: skip

    async def on_deviceinfo(self, op: str, cm: dict) -> None:
        """Watch handler of device-info ConfigMaps."""

        def parse(node: str, data):
            doc = formats.parse_device_info(data)
            return doc, formats.faults_from_device_info(node, doc)

        await self._consume(
            "deviceinfo", "device info", formats.DEVICEINFO_PREFIX, formats.SOURCE_DEVICEINFO, self.device_docs, parse,
            op, cm,
        )  # fmt: skip

    def _kept(self, docs: dict, node: str, kept) -> None:
        if kept is None:
            docs.pop(node, None)
        else:
            docs[node] = kept
        if docs is self._node_status:
            self.nodes.set_status(node, NODEINFO_REPORTER, kept)

    async def _consume(
        self, kind: str, what: str, prefix: str, source: str, docs: dict, parse, op: str, cm: dict
    ) -> None:
        """Apply one reference agent ConfigMap (node-info or device-info) to the fault center.

        ``parse(node, data) -> (kept, faults)`` raises ``formats.BadConfigMap``; ``kept`` is stored in
        ``docs[node]``. A delete clears the node's faults of ``source``; a ConfigMap of a node not (yet)
        known waits in ``_pending``; a bad one is rejected and counted; nothing stops the watch.
        """
        name = cm["metadata"]["name"]
        node = formats.node_name_of(name, prefix)
        if node is None:
            return
        try:
            if op == "delete":
                self._pending.pop((kind, node), None)
                self._kept(docs, node, None)
                await self.center.replace_source(node, source, [])
                return
            await self._wait_nodes()
            if not self.known_node(node):
                self._pending[(kind, node)] = cm
                self.metrics.reject("unknown_node", configmap=name, node=node)
                return
            try:
                kept, faults = parse(node, cm.get("data"))
            except formats.BadConfigMap as e:
                self.metrics.reject(e.reason, configmap=name, error=e.detail)
                return
            self._kept(docs, node, kept)
            await self.center.replace_source(node, source, faults)
            event(log, logging.DEBUG, f"{what} consumed", node=node, faults=len(faults))
        except Exception as e:  # never let one object stop the watch
            event(log, logging.ERROR, f"{what} not applied", configmap=name, error=repr(e))
        finally:
            self.mark(node)

    async def on_publicfault(self, op: str, cm: dict) -> None:
        """Add/change events are applied; deletes are ignored (a recover must be written), as in the reference."""
        key = (cm["metadata"].get("namespace", ""), cm["metadata"]["name"])
        if op == "delete":
            self._public_seen.pop(key, None)
            return
        raw = ((cm.get("data") or {}).get("PublicFault") or "").encode()
        if self._public_seen.get(key) == raw:
            return  # a re-list or a label-only change: already applied
        self._public_seen[key] = raw
        if not raw:
            self.metrics.reject("missing_key", configmap="/".join(key))
            return
        if self.public_faults is None:
            self.metrics.reject("no_pubfault", configmap="/".join(key))
            return
        from google.protobuf import json_format

        try:
            req = json_format.Parse(raw, pubfault_pb2.PublicFaultRequest(), ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError) as e:
            self.metrics.reject("bad_json", configmap="/".join(key), error=str(e)[:200])
            return
        try:
            resp = await self.public_faults(req)
        except Exception as e:
            event(
                log,
                logging.ERROR,
                "public fault configmap not applied",
                configmap="/".join(key),
                error=repr(e),
            )
            return
        if resp.code != 0:
            self.metrics.reject(f"publicfault_{resp.code}", configmap="/".join(key), info=resp.info)
        else:
            event(
                log,
                logging.INFO,
                "public fault configmap applied",
                configmap="/".join(key),
                faults=len(req.faults),
            )
