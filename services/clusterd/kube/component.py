"""clusterd's Kubernetes mode (``--kube``; issue 8, reference clusterd.md §5, §6.1, §6.5, §4.2).

Publishes the cluster view for Volcano and other consumers of the reference's ConfigMaps, consumes
the reference agents' ConfigMaps so faultmesh's brain can run over a fleet where they still run,
reads public-fault ConfigMaps, and annotates isolated nodes:

- **publish** ``cluster-info-device-<i>``, ``cluster-info-switch-<i>``, ``cluster-info-node-cm`` in
  ``--kube-publish-namespace`` (label ``mx-consumer-volcano=true``) from the fault center and the
  agents' device states. Shards are packed in node order (deterministic). A ConfigMap is written only
  when its content changed (an entry's ``UpdateTime`` moves only when that entry changes), at most
  once per ``--kube-min-write-s``; API errors back off exponentially and the write is retried;
  every ``--kube-resync-s`` the published ConfigMaps are read back and rewritten if someone changed
  them. Shards no longer needed are written as ``""`` (the reference's behaviour).
- **consume** ``mindx-dl-nodeinfo-<node>`` and ``mindx-dl-deviceinfo-<node>`` (label
  ``mx-consumer-cim=true``) with the CheckCode verified (Go-compatible JSON, :mod:`.gojson`); their
  faults enter the fault center as sources ``kube:nodeinfo`` / ``kube:deviceinfo`` (a deleted
  ConfigMap clears them). A bad CheckCode, bad JSON or a node that is not a Kubernetes Node is
  rejected with a log line and ``faultmesh_rejected_requests_total{service="kube",reason}``; a
  ConfigMap of an unknown node is applied when that Node appears.
- **public faults** from ConfigMaps labelled ``mc-consumer-publicfault=true`` (key ``PublicFault``),
  validated and applied by the PubFault component exactly like ``SendPublicFault``.
- **node annotation** ``NodeHealthyStatus=UnHealthy`` while a node is UnHealthy (isolated); removed
  when it recovers. Gauges ``faultmesh_node_unhealthy{node}`` and ``faultmesh_slow_node{node}``
  (code 110001010 active) feed the chart's alerts.

Watches re-list on 410 Gone and after errors, so no change is lost (:class:`.api.ListWatcher`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any

import orjson
from prometheus_client import Counter, Gauge

from clusterd.kube import formats
from clusterd.kube.api import Backoff, KubeApi, KubeError, ListWatcher
from faultmesh.config import read_secret
from faultmesh.levels import UNHEALTHY
from faultmesh.log import RateLimitedLog, event
from faultmesh.model import now_ms

log = logging.getLogger("clusterd.kube")

CIM_LABEL = ("mx-consumer-cim", "true")
VOLCANO_LABEL = ("mx-consumer-volcano", "true")
PUBLIC_FAULT_LABEL = ("mc-consumer-publicfault", "true")
HEALTH_ANNOTATION = "NodeHealthyStatus"
SLOW_NODE_CODE = "110001010"
MANAGED_BY = ("app.kubernetes.io/managed-by", "faultmesh-clusterd")


def _labels(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def _has_label(obj: dict, label: tuple[str, str]) -> bool:
    return _labels(obj).get(label[0]) == label[1]


class _InternalContext:
    """A gRPC-context stand-in so ConfigMap public faults go through SendPublicFault's own checks."""

    def __init__(self, token: str | None) -> None:
        self._md = (("authorization", f"Bearer {token}"),) if token else ()

    def invocation_metadata(self):
        return self._md

    async def abort(self, code, details):
        raise PermissionError(details)


class KubeComponent:
    """The ``--kube`` component of clusterd (see the module docstring). Inert without ``--kube``."""

    name = "kube"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("Kubernetes mode")
        g.add_argument("--kube", action="store_true", help="publish/consume the reference's ConfigMaps")
        g.add_argument(
            "--kubeconfig", help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)"
        )
        g.add_argument(
            "--kube-api", help="API server URL without auth (tests, kubectl proxy); overrides --kubeconfig"
        )
        g.add_argument(
            "--kube-publish-namespace", default="mindx-dl", help="namespace of cluster-info-* ConfigMaps"
        )
        g.add_argument(
            "--kube-deviceinfo-namespace", default="kube-system", help="namespace of mindx-dl-deviceinfo-*"
        )
        g.add_argument(
            "--kube-nodeinfo-namespace", default="mindx-dl", help="namespace of mindx-dl-nodeinfo-*"
        )
        g.add_argument(
            "--kube-publicfault-namespace",
            default="",
            help="namespace of public-fault ConfigMaps (empty: all)",
        )
        g.add_argument(
            "--kube-device-type", default="Ascend910", help="device resource name: Ascend910, Ascend310P, npu"
        )
        g.add_argument(
            "--kube-shard-bytes",
            type=int,
            default=formats.MAX_SHARD_BYTES,
            help="max bytes per cluster-info shard",
        )
        g.add_argument(
            "--kube-min-write-s", type=float, default=1.0, help="min interval between publish rounds (s)"
        )
        g.add_argument(
            "--kube-resync-s", type=float, default=60.0, help="read back published ConfigMaps every (s)"
        )
        g.add_argument("--kube-watch-timeout-s", type=int, default=300, help="server-side watch timeout (s)")
        g.add_argument("--kube-timeout-s", type=float, default=10.0, help="timeout of one API call (s)")

    def __init__(self, cd) -> None:
        self.cd = cd
        self.args = cd.args
        self.enabled = bool(getattr(cd.args, "kube", False))
        reg = cd.registry
        self.writes = Counter(
            "faultmesh_kube_writes_total",
            "Kubernetes writes by object kind and result",
            ["kind", "result"],
            registry=reg,
        )
        self.api_errors = Counter(
            "faultmesh_kube_api_errors_total", "Failed Kubernetes API calls", ["op", "status"], registry=reg
        )
        self.restarts = Counter(
            "faultmesh_kube_watch_restarts_total",
            "Watch restarts: expired and error re-list, ended resumes",
            ["watch", "why"],
            registry=reg,
        )
        self.shards = Gauge(
            "faultmesh_kube_published_shards", "Published cluster-info shards", ["kind"], registry=reg
        )
        self.node_unhealthy = Gauge(
            "faultmesh_node_unhealthy",
            "1 while the node is UnHealthy (series absent otherwise)",
            ["node"],
            registry=reg,
        )
        self.slow_node = Gauge(
            "faultmesh_slow_node",
            "1 while a slow-node fault (110001010) is active on the node",
            ["node"],
            registry=reg,
        )
        self._ratelog = RateLimitedLog(log)
        self._dirty = asyncio.Event()
        self._written: dict[str, str] = {}  # published ConfigMap name -> data value last written/read
        self._entries: dict[str, dict] = {}  # entry key (CmName) -> last published entry (with UpdateTime)
        self._device_docs: dict[str, formats.DeviceInfoDoc] = {}  # node -> consumed device info
        self._node_status: dict[str, str] = {}  # node -> NodeStatus from consumed node info
        self._pending: dict[tuple[str, str], dict] = {}  # CMs of nodes not (yet) known, by (kind, node)
        self._public_seen: dict[tuple[str, str], bytes] = {}
        self._annotated: dict[str, str] = {}  # node -> annotation value we set
        self._gauged_unhealthy: set[str] = set()
        self._gauged_slow: set[str] = set()
        self._api_client: Any = None
        self.api: KubeApi | None = None
        self.nodes: ListWatcher | None = None
        self.watchers: list[ListWatcher] = []
        self._last_resync = 0.0
        self._pubfault = None
        if self.enabled:
            cd.center.subscribe(lambda changes: self._dirty.set())
            cd.agents.on_connect(lambda node, agent: self._dirty.set())

    # -- lifecycle -------------------------------------------------------------------------------
    async def _make_client(self):
        from kubernetes_asyncio import client, config

        if self.args.kube_api:
            cfg = client.Configuration(host=self.args.kube_api.rstrip("/"))
        else:
            cfg = client.Configuration()
            if self.args.kubeconfig:
                await config.load_kube_config(config_file=self.args.kubeconfig, client_configuration=cfg)
            else:
                try:
                    config.load_incluster_config(client_configuration=cfg)
                except config.ConfigException:
                    await config.load_kube_config(client_configuration=cfg)
        return client.ApiClient(cfg)

    async def start(self) -> None:
        """Connect and start the watchers and the publisher (owned by ``cd.tasks``)."""
        if not self.enabled:
            return
        self._api_client = await self._make_client()
        self.api = KubeApi(self._api_client, timeout_s=self.args.kube_timeout_s)
        self._pubfault = next((c for c in self.cd.components if getattr(c, "name", "") == "pubfault"), None)
        a = self.args

        def watcher(name, kind, ns, selector, handler, accept):
            return ListWatcher(
                self.api,
                kind,
                ns or None,
                selector,
                handler,
                accept,
                watch_timeout_s=a.kube_watch_timeout_s,
                on_error=lambda e, n=name: self.api_errors.labels(f"watch {n}", str(e.status)).inc(),
                on_restart=lambda why, n=name: self.restarts.labels(n, why).inc(),
            )

        self.nodes = watcher("nodes", "nodes", None, "", self._on_node, lambda o: True)
        sel = "=".join(CIM_LABEL)
        self.watchers = [
            self.nodes,
            watcher(
                "nodeinfo",
                "configmaps",
                a.kube_nodeinfo_namespace,
                sel,
                self._on_nodeinfo,
                lambda o: (
                    _has_label(o, CIM_LABEL)
                    and o["metadata"].get("name", "").startswith(formats.NODEINFO_PREFIX)
                ),
            ),
            watcher(
                "deviceinfo",
                "configmaps",
                a.kube_deviceinfo_namespace,
                sel,
                self._on_deviceinfo,
                lambda o: (
                    _has_label(o, CIM_LABEL)
                    and o["metadata"].get("name", "").startswith(formats.DEVICEINFO_PREFIX)
                ),
            ),
            watcher(
                "publicfault",
                "configmaps",
                a.kube_publicfault_namespace,
                "=".join(PUBLIC_FAULT_LABEL),
                self._on_publicfault,
                lambda o: _has_label(o, PUBLIC_FAULT_LABEL),
            ),
        ]
        for w in self.watchers:
            self.cd.tasks.spawn(w.run(), name=f"kube-watch-{w.kind}-{w.namespace or 'all'}")
        self.cd.tasks.spawn(self._publisher(), name="kube-publisher")
        self._dirty.set()
        event(
            log,
            logging.INFO,
            "kube mode started",
            publish_namespace=a.kube_publish_namespace,
            api=a.kube_api or a.kubeconfig or "in-cluster",
        )

    async def stop(self) -> None:
        if self._api_client is not None:
            await self._api_client.close()
            self._api_client = None

    # -- consume -----------------------------------------------------------------------------------
    def _reject(self, reason: str, **kv: Any) -> None:
        self.cd.rejected.labels("kube", reason).inc()
        self._ratelog.warning(reason, "kube configmap rejected", **kv)

    def _known_node(self, node: str) -> bool:
        return self.nodes is not None and ("", node) in self.nodes.objects

    async def _on_node(self, op: str, obj: dict) -> None:
        node = obj["metadata"]["name"]
        if op == "upsert":
            for kind in ("nodeinfo", "deviceinfo"):
                cm = self._pending.pop((kind, node), None)
                if cm is not None:
                    await (self._on_nodeinfo if kind == "nodeinfo" else self._on_deviceinfo)("upsert", cm)
        else:
            self._annotated.pop(node, None)
        self._dirty.set()

    async def _wait_nodes(self) -> None:
        if self.nodes is not None and not self.nodes.synced.is_set():
            try:
                await asyncio.wait_for(self.nodes.synced.wait(), self.args.kube_timeout_s * 3)
            except TimeoutError:
                pass

    async def _on_nodeinfo(self, op: str, cm: dict) -> None:
        name = cm["metadata"]["name"]
        node = formats.node_name_of(name, formats.NODEINFO_PREFIX)
        if node is None:
            return
        try:
            if op == "delete":
                self._pending.pop(("nodeinfo", node), None)
                self._node_status.pop(node, None)
                await self.cd.center.replace_source(node, formats.SOURCE_NODEINFO, [])
                return
            await self._wait_nodes()
            if not self._known_node(node):
                self._pending[("nodeinfo", node)] = cm
                self._reject("unknown_node", configmap=name, node=node)
                return
            try:
                doc = formats.parse_node_info(cm.get("data"))
            except formats.BadConfigMap as e:
                self._reject(e.reason, configmap=name, error=e.detail)
                return
            faults = formats.faults_from_node_info(node, doc, now_ms())
            self._node_status[node] = doc.info["NodeStatus"]
            await self.cd.center.replace_source(node, formats.SOURCE_NODEINFO, faults)
            event(log, logging.DEBUG, "node info consumed", node=node, faults=len(faults))
        except Exception as e:  # never let one object stop the watch
            event(log, logging.ERROR, "node info not applied", configmap=name, error=repr(e))
        finally:
            self._dirty.set()

    async def _on_deviceinfo(self, op: str, cm: dict) -> None:
        name = cm["metadata"]["name"]
        node = formats.node_name_of(name, formats.DEVICEINFO_PREFIX)
        if node is None:
            return
        try:
            if op == "delete":
                self._pending.pop(("deviceinfo", node), None)
                self._device_docs.pop(node, None)
                await self.cd.center.replace_source(node, formats.SOURCE_DEVICEINFO, [])
                return
            await self._wait_nodes()
            if not self._known_node(node):
                self._pending[("deviceinfo", node)] = cm
                self._reject("unknown_node", configmap=name, node=node)
                return
            try:
                doc = formats.parse_device_info(cm.get("data"))
                faults = formats.faults_from_device_info(node, doc)
            except formats.BadConfigMap as e:
                self._reject(e.reason, configmap=name, error=e.detail)
                return
            self._device_docs[node] = doc
            await self.cd.center.replace_source(node, formats.SOURCE_DEVICEINFO, faults)
            event(log, logging.DEBUG, "device info consumed", node=node, faults=len(faults))
        except Exception as e:
            event(log, logging.ERROR, "device info not applied", configmap=name, error=repr(e))
        finally:
            self._dirty.set()

    async def _on_publicfault(self, op: str, cm: dict) -> None:
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
            self._reject("missing_key", configmap="/".join(key))
            return
        if self._pubfault is None:
            self._reject("no_pubfault", configmap="/".join(key))
            return
        from google.protobuf import json_format

        from faultmesh._pb import pubfault_pb2

        try:
            req = json_format.Parse(raw, pubfault_pb2.PublicFaultRequest(), ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError) as e:
            self._reject("bad_json", configmap="/".join(key), error=str(e)[:200])
            return
        token = read_secret(self.args.token_file) if getattr(self.args, "token_file", None) else None
        try:
            resp = await self._pubfault.SendPublicFault(req, _InternalContext(token))
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
            self._reject(f"publicfault_{resp.code}", configmap="/".join(key), info=resp.info)
        else:
            event(
                log,
                logging.INFO,
                "public fault configmap applied",
                configmap="/".join(key),
                faults=len(req.faults),
            )

    # -- publish -----------------------------------------------------------------------------------
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

    def desired(self) -> dict[str, str]:
        """ConfigMap name -> data value of everything Kubernetes mode publishes now."""
        a = self.args
        center = self.cd.center
        type_name = a.kube_device_type
        now_s = int(time.time())
        npu, switch, node_faults = {}, {}, {}
        for f in center.faults():
            if f.device_type in ("NPU", type_name) or f.source.startswith("public:"):
                npu.setdefault(f.node, []).append(f)
            elif f.device_type == "Switch":
                switch.setdefault(f.node, []).append(f)
            else:
                node_faults.setdefault(f.node, []).append(f)
        known = self.cd.agents.known
        dev_nodes = set(npu) | set(self._device_docs) | {n for n, i in known.items() if i.get("devices")}
        devices = {}
        for node in sorted(dev_nodes):
            devs = list((known.get(node) or {}).get("devices", {}).values())
            devs = [d for d in devs if d.get("device_type") in ("NPU", type_name, "")]
            entry = formats.build_device_entry(
                node, type_name, npu.get(node, []), devs, self._device_docs.get(node)
            )
            devices[entry["CmName"]] = self._stamp(entry["CmName"], entry, now_s)
        sw_nodes = set(switch) | {n for n, d in self._device_docs.items() if d.switch_info}
        switches = {}
        for node in sorted(sw_nodes):
            base = self._device_docs[node].switch_info if node in self._device_docs else None
            entry = formats.build_switch_entry(node, switch.get(node, []), base)
            switches[entry["CmName"]] = self._stamp(entry["CmName"], entry, now_s)
        status_nodes = set(node_faults) | {n for n, s in self._node_status.items() if s and s != "Healthy"}
        status_nodes |= {n for n, i in known.items() if i.get("node_status") not in (None, "", "Healthy")}
        nodes = {}
        for node in sorted(status_nodes):
            agent_status = self._node_status.get(node) or (known.get(node) or {}).get("node_status", "")
            entry = formats.build_node_entry(node, node_faults.get(node, []), agent_status)
            nodes[entry["CmName"]] = self._stamp(entry["CmName"], entry, now_s)
        out: dict[str, str] = {}
        for prefix, entries in ((formats.DEVICE_CM_PREFIX, devices), (formats.SWITCH_CM_PREFIX, switches)):
            shards = formats.shard(entries, a.kube_shard_bytes) or [""]
            for i, data in enumerate(shards):
                out[f"{prefix}{i}"] = data
            self.shards.labels(prefix.rstrip("-")).set(len(shards) if entries else 0)
        out[formats.NODE_CM_NAME] = formats.shard(nodes, 1 << 62)[0] if nodes else ""
        # Surplus shards from earlier rounds (or an earlier process) are emptied, not deleted.
        for name in self._written:
            if name not in out:
                out[name] = ""
        live = {e for e in (*devices, *switches, *nodes)}
        for k in [k for k in self._entries if k not in live]:
            del self._entries[k]
        return out

    async def _seed(self) -> None:
        """Read what is already published (a restart must not rewrite unchanged ConfigMaps)."""
        ns = self.args.kube_publish_namespace
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
        ns = self.args.kube_publish_namespace
        labels = dict([VOLCANO_LABEL, MANAGED_BY])
        patch = {"metadata": {"labels": labels}, "data": {name: value}}
        try:
            await self.api.patch_config_map(ns, name, patch)
        except KubeError as e:
            if e.status != 404:
                raise
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "data": {name: value},
            }
            try:
                await self.api.create_config_map(ns, body)
            except KubeError as e2:
                if e2.status != 409:
                    raise
                await self.api.patch_config_map(ns, name, patch)  # created meanwhile: update it
        self._written[name] = value

    async def _resync(self) -> None:
        """Forget what differs on the server (edited or deleted by someone), so it is rewritten."""
        ns = self.args.kube_publish_namespace
        items, _ = await self.api.list_config_maps(ns, "=".join(VOLCANO_LABEL))
        live = {(cm.get("metadata") or {}).get("name", ""): (cm.get("data") or {}) for cm in items}
        for name in list(self._written):
            if live.get(name, {}).get(name) != self._written[name]:
                del self._written[name]

    async def publish_once(self) -> int:
        """Write every changed ConfigMap. Returns how many were written. Raises :class:`KubeError`."""
        desired = self.desired()
        n = 0
        for name in sorted(desired):
            if self._written.get(name) == desired[name]:
                continue
            try:
                await self._write(name, desired[name])
            except KubeError as e:
                self.writes.labels("configmap", "error").inc()
                self.api_errors.labels(e.op, str(e.status)).inc()
                raise
            self.writes.labels("configmap", "ok").inc()
            n += 1
        await self._annotate()
        return n

    async def _annotate(self) -> None:
        """NodeHealthyStatus=UnHealthy on UnHealthy nodes, removed on recovery; health gauges."""
        from clusterd.http_api import node_summary

        center = self.cd.center
        names = (
            center.node_names() | set(self.cd.agents.known) | set(self._node_status) | set(self._annotated)
        )
        unhealthy, slow = set(), set()
        for node in names:
            health = node_summary(self.cd, node)["health"]
            if health == UNHEALTHY or self._node_status.get(node) == UNHEALTHY:
                unhealthy.add(node)
        for f in center.faults():
            if f.code == SLOW_NODE_CODE:
                slow.add(f.node)
        for node in sorted(unhealthy - self._gauged_unhealthy):
            self.node_unhealthy.labels(node).set(1)
        for node in sorted(self._gauged_unhealthy - unhealthy):
            self.node_unhealthy.remove(node)
        self._gauged_unhealthy = unhealthy
        for node in sorted(slow - self._gauged_slow):
            self.slow_node.labels(node).set(1)
        for node in sorted(self._gauged_slow - slow):
            self.slow_node.remove(node)
        self._gauged_slow = slow
        for node in sorted(unhealthy | set(self._annotated)):
            if not self._known_node(node):
                continue
            want = UNHEALTHY if node in unhealthy else None
            if self._annotated.get(node) == want:
                continue
            try:
                await self.api.patch_node(node, {"metadata": {"annotations": {HEALTH_ANNOTATION: want}}})
            except KubeError as e:
                self.writes.labels("node", "error").inc()
                self.api_errors.labels(e.op, str(e.status)).inc()
                if e.status == 404:
                    continue
                raise
            self.writes.labels("node", "ok").inc()
            event(
                log,
                logging.INFO,
                "node annotated" if want else "node annotation removed",
                node=node,
                annotation=HEALTH_ANNOTATION,
                value=want or "",
            )
            if want:
                self._annotated[node] = want
            else:
                self._annotated.pop(node, None)

    async def _publisher(self) -> None:
        a = self.args
        backoff = Backoff(0.2, 30.0)
        seeded = False
        while True:
            if not seeded:
                try:
                    await self._seed()
                    seeded = True
                    self._last_resync = time.monotonic()
                except KubeError as e:
                    self.api_errors.labels(e.op, str(e.status)).inc()
                    delay = backoff.next()
                    event(
                        log,
                        logging.WARNING,
                        "kube publish failed, retrying",
                        error=str(e),
                        retry_s=round(delay, 2),
                    )
                    await asyncio.sleep(delay)
                    continue
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=max(0.05, a.kube_resync_s))
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
                delay = backoff.next()
                event(
                    log,
                    logging.WARNING,
                    "kube publish failed, retrying",
                    error=str(e),
                    retry_s=round(delay, 2),
                )
                await asyncio.sleep(delay)
                continue
            await asyncio.sleep(a.kube_min_write_s)
