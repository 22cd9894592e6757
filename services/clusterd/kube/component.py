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
  when it recovers. (The per-node gauges the chart's alerts use, ``faultmesh_node_unhealthy`` and
  ``faultmesh_slow_node``, are exported by ClusterD's core in every mode: clusterd.center.NodeHealthCollector.)

- **jobs from pods** (``--kube-jobs on``): NPU pods (device and ``hccl/rankIndex`` annotations)
  grouped by their controlling owner become jobs in ``cd.jobs`` (:mod:`.jobs`); a job whose pods are
  all gone is removed (only jobs this component created, remembered in the store).

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
from clusterd.kube import jobs as kjobs
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
ANNOTATE_CONCURRENCY = 8  # node patches in flight
MANAGED_BY = ("app.kubernetes.io/managed-by", "faultmesh-clusterd")


def _shard_order(name: str) -> tuple[str, int]:
    """``cluster-info-device-10`` after ``-9``: shards are written in numeric order, so a node moving
    to an earlier shard is never missing in between (it may briefly appear twice)."""
    prefix, _, tail = name.rpartition("-")
    return (prefix, int(tail)) if tail.isdigit() else (name, -1)


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
        g.add_argument(
            "--kube-jobs",
            choices=("on", "off"),
            default="on",
            help="discover training jobs from pods into the job registry",
        )

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
        self._ratelog = RateLimitedLog(log)
        self._dirty = asyncio.Event()
        self._written: dict[str, str] = {}  # published ConfigMap name -> data value last written/read
        self._entries: dict[str, dict] = {}  # entry key (CmName) -> last published entry (with UpdateTime)
        # kind (device / switch / node) -> node -> (entry key, serialized entry): rebuilt per changed node
        self._parts: dict[str, dict[str, tuple[str, str]]] = {"device": {}, "switch": {}, "node": {}}
        self._dirty_nodes: set[str] = set()
        self._full_refresh = True
        self._device_docs: dict[str, formats.DeviceInfoDoc] = {}  # node -> consumed device info
        self._node_status: dict[str, str] = {}  # node -> NodeStatus from consumed node info
        self._pending: dict[tuple[str, str], dict] = {}  # CMs of nodes not (yet) known, by (kind, node)
        self._public_seen: dict[tuple[str, str], bytes] = {}
        self._annotated: dict[str, str] = {}  # node -> annotation value we set
        self._job_pods: dict[str, dict[tuple[str, str], dict]] = {}  # job id -> pod key -> pod
        self._pod_job: dict[tuple[str, str], tuple[str, str, str]] = {}  # pod key -> (job id, name, ns)
        self._jobs_dirty: set[tuple[str, str, str]] = set()
        self._jobs_event = asyncio.Event()
        self._api_client: Any = None
        self._tasks: list[asyncio.Task] = []
        self._annotate_due = asyncio.Event()
        self.api: KubeApi | None = None
        self.nodes: ListWatcher | None = None
        self.pods: ListWatcher | None = None
        self.watchers: list[ListWatcher] = []
        self._last_resync = 0.0
        self._pubfault = None
        if self.enabled:
            cd.center.subscribe(self._on_changes)
            cd.agents.on_connect(lambda node, agent: self._mark(node))

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
        from kubernetes_asyncio.config import ConfigException

        try:
            self._api_client = await self._make_client()
        except (ConfigException, OSError, ValueError) as e:
            # OSError: clusterd's start path reports it as "clusterd failed to start" and exits 1.
            raise OSError(f"--kube: cannot load the Kubernetes client configuration: {e}") from None
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
        if a.kube_jobs == "on" and getattr(self.cd, "jobs", None) is not None:
            self.pods = watcher("pods", "pods", None, "", self._on_pod, kjobs.is_job_pod)
            self.watchers.append(self.pods)
            self._tasks.append(self.cd.tasks.spawn(self._job_sync(), name="kube-job-sync"))
        elif a.kube_jobs == "on":
            event(log, logging.WARNING, "kube job discovery off: no job registry in this clusterd")
        for w in self.watchers:
            self._tasks.append(
                self.cd.tasks.spawn(w.run(), name=f"kube-watch-{w.kind}-{w.namespace or 'all'}")
            )
        self._tasks.append(self.cd.tasks.spawn(self._publisher(), name="kube-publisher"))
        self._tasks.append(self.cd.tasks.spawn(self._annotator(), name="kube-annotator"))
        self._dirty.set()
        event(
            log,
            logging.INFO,
            "kube mode started",
            publish_namespace=a.kube_publish_namespace,
            api=a.kube_api or a.kubeconfig or "in-cluster",
        )

    async def stop(self) -> None:
        """Cancel the watchers and the publisher (before the API client closes under them)."""
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks.clear()
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
        self._mark(node)

    async def _wait_nodes(self) -> None:
        if self.nodes is not None and not self.nodes.synced.is_set():
            try:
                await asyncio.wait_for(self.nodes.synced.wait(), self.args.kube_timeout_s * 3)
            except TimeoutError:
                pass

    async def _on_nodeinfo(self, op: str, cm: dict) -> None:
        def parse(node: str, data):
            doc = formats.parse_node_info(data)
            return doc.info["NodeStatus"], formats.faults_from_node_info(node, doc, now_ms())

        await self._consume(
            "nodeinfo",
            "node info",
            formats.NODEINFO_PREFIX,
            formats.SOURCE_NODEINFO,
            self._node_status,
            parse,
            op,
            cm,
        )

    async def _on_deviceinfo(self, op: str, cm: dict) -> None:
        def parse(node: str, data):
            doc = formats.parse_device_info(data)
            return doc, formats.faults_from_device_info(node, doc)

        await self._consume(
            "deviceinfo", "device info", formats.DEVICEINFO_PREFIX, formats.SOURCE_DEVICEINFO, self._device_docs, parse,
            op, cm,
        )  # fmt: skip

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
                docs.pop(node, None)
                await self.cd.center.replace_source(node, source, [])
                return
            await self._wait_nodes()
            if not self._known_node(node):
                self._pending[(kind, node)] = cm
                self._reject("unknown_node", configmap=name, node=node)
                return
            try:
                kept, faults = parse(node, cm.get("data"))
            except formats.BadConfigMap as e:
                self._reject(e.reason, configmap=name, error=e.detail)
                return
            docs[node] = kept
            await self.cd.center.replace_source(node, source, faults)
            event(log, logging.DEBUG, f"{what} consumed", node=node, faults=len(faults))
        except Exception as e:  # never let one object stop the watch
            event(log, logging.ERROR, f"{what} not applied", configmap=name, error=repr(e))
        finally:
            self._mark(node)

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

    # -- jobs from pods --------------------------------------------------------------------------
    async def _on_pod(self, op: str, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        old = self._pod_job.pop(key, None)
        if old is not None:
            self._job_pods.get(old[0], {}).pop(key, None)
            self._jobs_dirty.add(old)
        owner = kjobs.job_owner(pod) if op == "upsert" else None
        if owner is not None:
            job = (owner[0], owner[1], key[0])
            self._pod_job[key] = job
            self._job_pods.setdefault(job[0], {})[key] = pod
            self._jobs_dirty.add(job)
        self._jobs_event.set()

    async def _sync_job(self, job_id: str, name: str, namespace: str) -> None:
        from clusterd.brain.jobs import JobSpecError, parse_job

        registry = self.cd.jobs
        pods = list(self._job_pods.get(job_id, {}).values())
        owned = await self.cd.store.kv_get("kube-jobs", job_id)
        if not pods:
            self._job_pods.pop(job_id, None)
            if owned is not None:
                await registry.delete(job_id)
                await self.cd.store.kv_delete("kube-jobs", job_id)
                event(log, logging.INFO, "kube job removed", job=f"{namespace}/{name}", jobId=job_id)
            return
        try:
            job = parse_job(kjobs.job_spec(job_id, name, namespace, pods))
        except (kjobs.BadPod, JobSpecError) as e:
            self._reject("bad_job_pods", job=f"{namespace}/{name}", error=str(e))
            return
        other = registry.by_ns_name(namespace, name)
        if other is not None and other.id != job_id:
            if await self.cd.store.kv_get("kube-jobs", other.id) is None:
                self._reject("job_name_taken", job=f"{namespace}/{name}", other=other.id)
                return
            await registry.delete(other.id)  # the job was re-created under a new UID
            await self.cd.store.kv_delete("kube-jobs", other.id)
        if owned is None:
            await self.cd.store.kv_put("kube-jobs", job_id, {"name": name, "namespace": namespace})
        (res,) = await registry.apply([job])
        if res[1] != "unchanged":
            event(
                log,
                logging.INFO,
                f"kube job {res[1]}",
                job=f"{namespace}/{name}",
                jobId=job_id,
                ranks=len(job.ranks),
                status=job.status,
            )

    async def _job_sync(self) -> None:
        """Apply the jobs whose pods changed (debounced), and after the first pod list remove the
        jobs this component created whose pods are all gone."""
        reconciled = False
        while True:
            await self._jobs_event.wait()
            await asyncio.sleep(0.1)  # let a burst of pod events settle
            self._jobs_event.clear()
            dirty, self._jobs_dirty = self._jobs_dirty, set()
            if not reconciled and self.pods is not None and self.pods.synced.is_set():
                reconciled = True
                for job_id, info in (await self.cd.store.kv_items("kube-jobs")).items():
                    if job_id not in self._job_pods:
                        dirty.add((job_id, str(info.get("name", "")), str(info.get("namespace", ""))))
            for job_id, name, ns in sorted(dirty):
                try:
                    await self._sync_job(job_id, name, ns)
                except Exception as e:  # a store error must not stop discovery
                    event(log, logging.ERROR, "kube job not applied", job=f"{ns}/{name}", error=repr(e))
            if not reconciled:
                self._jobs_event.set()
                await asyncio.sleep(0.2)

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

    def _mark(self, node: str) -> None:
        self._dirty_nodes.add(node)
        self._dirty.set()

    def _on_changes(self, changes) -> None:
        for c in changes:
            self._dirty_nodes.add(c.fault.node)
        self._dirty.set()

    def _rebuild_node(self, node: str, faults: list, now_s: int) -> None:
        """Recompute the three cluster-info entries of ``node`` into the per-kind caches."""
        type_name = self.args.kube_device_type
        npu, switch, node_faults = [], [], []
        for f in faults:
            if f.device_type in ("NPU", type_name) or f.source.startswith("public:"):
                npu.append(f)
            elif f.device_type == "Switch":
                switch.append(f)
            else:
                node_faults.append(f)
        info = self.cd.agents.known.get(node) or {}
        devs = [
            d for d in (info.get("devices") or {}).values() if d.get("device_type") in ("NPU", type_name, "")
        ]
        doc = self._device_docs.get(node)
        agent_status = self._node_status.get(node) or info.get("node_status", "")
        present = {
            "device": bool(npu or doc or devs),
            "switch": bool(switch or (doc and doc.switch_info)),
            "node": bool(node_faults or agent_status not in ("", "Healthy")),
        }
        for kind, cache in self._parts.items():
            if not present[kind]:
                if node in cache:
                    self._entries.pop(cache.pop(node)[0], None)
                continue
            if kind == "device":
                entry = formats.build_device_entry(node, type_name, npu, devs, doc)
            elif kind == "switch":
                entry = formats.build_switch_entry(node, switch, doc.switch_info if doc else None)
            else:
                entry = formats.build_node_entry(node, node_faults, agent_status)
            key = entry["CmName"]
            cache[node] = (key, formats.entry_part(key, self._stamp(key, entry, now_s)))

    async def refresh(self, full: bool = False) -> None:
        """Recompute the entries of the nodes that changed (all nodes when ``full``), yielding to the
        loop every 256 nodes so a 16k-node rebuild never stalls ingest."""
        nodes = set(self._dirty_nodes)
        self._dirty_nodes.clear()
        by_node: dict[str, list] = {}
        for f in self.cd.center.faults():
            by_node.setdefault(f.node, []).append(f)
        if full:
            known = self.cd.agents.known
            nodes |= set(by_node) | set(self._device_docs) | set(self._node_status) | set(known)
            for cache in self._parts.values():
                nodes |= set(cache)
        now_s = int(time.time())
        for i, node in enumerate(sorted(nodes)):
            self._rebuild_node(node, by_node.get(node, []), now_s)
            if i % 256 == 255:
                await asyncio.sleep(0)

    def desired(self) -> dict[str, str]:
        """ConfigMap name -> data value of everything Kubernetes mode publishes (from the caches)."""
        a = self.args
        out: dict[str, str] = {}
        for prefix, kind in ((formats.DEVICE_CM_PREFIX, "device"), (formats.SWITCH_CM_PREFIX, "switch")):
            parts = list(self._parts[kind].values())
            shards = formats.shard_parts(parts, a.kube_shard_bytes) or [""]
            for i, data in enumerate(shards):
                out[f"{prefix}{i}"] = data
            self.shards.labels(prefix.rstrip("-")).set(len(shards) if parts else 0)
        parts = list(self._parts["node"].values())
        out[formats.NODE_CM_NAME] = formats.shard_parts(parts, 1 << 62)[0] if parts else ""
        # Surplus shards from earlier rounds (or an earlier process) are emptied, not deleted.
        for name in self._written:
            if name not in out:
                out[name] = ""
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
        """Forget what differs on the server (edited or deleted by someone), so it is rewritten, and
        rebuild every entry once (device states that changed without a fault change)."""
        self._full_refresh = True
        ns = self.args.kube_publish_namespace
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
                self.writes.labels("configmap", "error").inc()
                self.api_errors.labels(e.op, str(e.status)).inc()
                raise
            self.writes.labels("configmap", "ok").inc()
            n += 1
        self._annotate_due.set()
        return n

    async def _annotate(self) -> None:
        """NodeHealthyStatus=UnHealthy on UnHealthy nodes, removed on recovery."""
        center = self.cd.center
        unhealthy = {n for n in center.node_names() if center.node_health(n)[0] == UNHEALTHY}
        unhealthy |= {n for n, i in self.cd.agents.known.items() if i.get("node_status") == UNHEALTHY}
        unhealthy |= {n for n, s in self._node_status.items() if s == UNHEALTHY}
        todo = []
        for node in sorted(unhealthy | set(self._annotated)):
            want = UNHEALTHY if node in unhealthy else None
            if self._known_node(node) and self._annotated.get(node) != want:
                todo.append((node, want))
        sem = asyncio.Semaphore(ANNOTATE_CONCURRENCY)
        results = await asyncio.gather(*(self._annotate_one(node, want, sem) for node, want in todo))
        failed = [e for e in results if e is not None]
        if failed:
            raise failed[0]

    async def _annotate_one(self, node: str, want: str | None, sem: asyncio.Semaphore) -> KubeError | None:
        """Patch one node's annotation; returns the error (None on success or when the node is gone)."""
        async with sem:
            try:
                await self.api.patch_node(node, {"metadata": {"annotations": {HEALTH_ANNOTATION: want}}})
            except KubeError as e:
                self.writes.labels("node", "error").inc()
                self.api_errors.labels(e.op, str(e.status)).inc()
                return None if e.status == 404 else e
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
        return None

    async def _annotator(self) -> None:
        """Node annotations and health gauges, after each publish round, in their own task so a burst
        of isolated nodes never delays cluster-info; API errors back off and retry."""
        backoff = Backoff(0.2, 30.0)
        while True:
            await self._annotate_due.wait()
            self._annotate_due.clear()
            try:
                await self._annotate()
                backoff.reset()
            except KubeError as e:
                self._annotate_due.set()
                delay = backoff.next()
                event(
                    log,
                    logging.WARNING,
                    "node annotation failed, retrying",
                    error=str(e),
                    retry_s=round(delay, 2),
                )
                await asyncio.sleep(delay)

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
