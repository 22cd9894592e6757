"""Kubernetes mode, node signals (issue 15): what ``kubectl describe node`` and NPD / NVSentinel-style
remediation read.

- **NodeConditions**, one per fault class, on every Kubernetes Node clusterd knows: ``NPUHealthy``
  (NPU chip, network and switch faults), ``NodeHardwareHealthy`` (BMC, storage and other node
  faults) -- status ``False`` while a fault of the class whose level is not NotHandle is active --
  and ``SlowNode`` (``True`` while the slow-node fault 110001010 is active). ``reason`` is the worst
  level (``NoFault`` when clear), ``message`` lists up to 8 faults. Written with a strategic merge
  patch of ``status.conditions`` (merged by type: the kubelet's conditions are kept), only when
  status, reason or message changed; ``lastTransitionTime`` moves only when the status flips.
- **Events**: one per fault occur (``FaultOccurred``, Warning) and recover (``FaultRecovered``,
  Normal) on the Node (namespace ``--kube-event-namespace``), named ``<node>.<hex ns>`` as the
  kubelet names its events; at most ``--kube-event-rate``/s (burst 10x), the rest are dropped and
  counted (``faultmesh_kube_events_dropped_total``).
- **Taint** ``--kube-taint-key``:NoSchedule on UnHealthy nodes (:meth:`clusterd.nodes.NodeRegistry.health`)
  when ``--kube-taint on`` (off by default), removed on recovery. A circuit breaker stops adding
  taints while tainted nodes would exceed ``--kube-taint-max-share`` of the cluster's Nodes (as
  NVSentinel does): logged once per opening, ``faultmesh_kube_taint_breaker_open`` = 1.

The fault center's ``kube-signals`` subscriber only marks nodes dirty and queues events; one task
writes, API errors back off (:class:`faultmesh.retry.Backoff`) and retry.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from clusterd.center import FaultCenter
from clusterd.kube.metrics import KubeMetrics
from clusterd.nodes import SLOW_NODE_CODE, NodeRegistry
from faultmesh.kube import KubeApi, KubeError, run_when_due
from faultmesh.levels import UNHEALTHY, level_severity
from faultmesh.log import event
from faultmesh.model import ChangeKind, Fault
from faultmesh.ratelimit import TokenBucket

log = logging.getLogger("clusterd.kube")

NPU_HEALTHY = "NPUHealthy"
NODE_HARDWARE_HEALTHY = "NodeHardwareHealthy"
SLOW_NODE = "SlowNode"
CONDITION_TYPES = (NPU_HEALTHY, NODE_HARDWARE_HEALTHY, SLOW_NODE)
NPU_DEVICE_TYPES = frozenset({"NPU", "Ascend910", "Ascend310P", "Ascend310", "npu", "Switch"})
INFORMATIONAL = frozenset({"NotHandleFault", "NotHandle", ""})
MESSAGE_FAULTS = 8
EVENT_QUEUE = 10_000
COMPONENT = "faultmesh-clusterd"


@dataclass(frozen=True)
class SignalsConfig:
    """The node signals' configuration section (:func:`faultmesh.config.section`):
    ``kube_conditions`` ``--kube-conditions``, ``kube_events`` ``--kube-events`` (``on`` / ``off``),
    ``kube_event_namespace`` ``--kube-event-namespace``, ``kube_event_rate`` ``--kube-event-rate``
    (events/s), ``kube_taint`` ``--kube-taint`` (``on`` / ``off``), ``kube_taint_key``
    ``--kube-taint-key``, ``kube_taint_max_share`` ``--kube-taint-max-share`` (0..1 of the Nodes)."""

    kube_conditions: str
    kube_events: str
    kube_event_namespace: str
    kube_event_rate: float
    kube_taint: str
    kube_taint_key: str
    kube_taint_max_share: float


def add_arguments(g) -> None:
    """The node-signal flags (on clusterd's Kubernetes argument group ``g``)."""
    g.add_argument(
        "--kube-conditions", choices=("on", "off"), default="on", help="NodeConditions per fault class"
    )
    g.add_argument(
        "--kube-events", choices=("on", "off"), default="on", help="an Event per fault occur/recover"
    )
    g.add_argument("--kube-event-namespace", default="default", help="namespace of the Node events")
    g.add_argument("--kube-event-rate", type=float, default=10.0, help="at most this many events per second")
    g.add_argument(
        "--kube-taint", choices=("on", "off"), default="off", help="taint UnHealthy nodes NoSchedule"
    )
    g.add_argument("--kube-taint-key", default="faultmesh.io/unhealthy", help="key of the NoSchedule taint")
    g.add_argument(
        "--kube-taint-max-share",
        type=float,
        default=0.1,
        help="circuit breaker: never taint more than this share of the cluster's Nodes",
    )


def fault_class(f: Fault) -> str:
    """The condition type a fault belongs to."""
    if f.code == SLOW_NODE_CODE:
        return SLOW_NODE
    if f.device_type in NPU_DEVICE_TYPES or f.source.startswith(("kube:deviceinfo", "public:")):
        return NPU_HEALTHY
    return NODE_HARDWARE_HEALTHY


def _describe(f: Fault) -> str:
    return f"{f.device_type} {f.device_id} {f.code} {f.level}"


def conditions_of(faults: list[Fault]) -> dict[str, tuple[str, str, str]]:
    """Condition type -> (status, reason, message) for a node's active faults."""
    by: dict[str, list[Fault]] = {t: [] for t in CONDITION_TYPES}
    for f in faults:
        if f.level not in INFORMATIONAL or fault_class(f) == SLOW_NODE:
            by[fault_class(f)].append(f)
    out = {}
    for t, fs in by.items():
        fs.sort(key=lambda f: (-level_severity(f.level), f.device_type, f.device_id, f.code))
        if not fs:
            out[t] = ("False" if t == SLOW_NODE else "True", "NoFault", "no active fault")
            continue
        msg = "; ".join(_describe(f) for f in fs[:MESSAGE_FAULTS])
        if len(fs) > MESSAGE_FAULTS:
            msg += f"; and {len(fs) - MESSAGE_FAULTS} more"
        out[t] = ("True" if t == SLOW_NODE else "False", fs[0].level or "Fault", msg)
    return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeSignals:
    """See the module docstring. ``known_node(node)``; ``node_count()``: Kubernetes Nodes in the
    cluster; ``node_taints(node)``: the Node's current ``spec.taints`` (from the Nodes watch)."""

    def __init__(
        self,
        cfg: SignalsConfig,
        center: FaultCenter,
        nodes: NodeRegistry,
        metrics: KubeMetrics,
        known_node: Callable[[str], bool],
        node_count: Callable[[], int],
        node_taints: Callable[[str], list],
        registry=None,
    ) -> None:
        self.cfg = cfg
        self.center = center
        self.nodes = nodes
        self.metrics = metrics
        self.known_node = known_node
        self.node_count = node_count
        self.node_taints = node_taints
        self.api: KubeApi | None = None
        self.due = asyncio.Event()
        self._dirty: set[str] = set()
        self._conds: dict[str, dict[str, tuple[str, str, str]]] = {}  # node -> type -> written
        self._tainted: set[str] = set()
        self._events: collections.deque[tuple[str, str, str, str]] = collections.deque(maxlen=EVENT_QUEUE)
        self._bucket = TokenBucket(max(0.01, cfg.kube_event_rate), max(1.0, cfg.kube_event_rate * 10))
        self._breaker_open = False
        reg = registry
        self.events_dropped = Counter(
            "faultmesh_kube_events_dropped", "Node events not sent (rate limit, queue full)", registry=reg
        )
        self.breaker = Gauge(
            "faultmesh_kube_taint_breaker_open",
            "1 while the taint circuit breaker holds back taints",
            registry=reg,
        )

    # -- intake ----------------------------------------------------------------------------------
    def on_changes(self, changes) -> None:
        """The fault-center subscription: mark nodes, queue occur/recover events."""
        for c in changes:
            self._dirty.add(c.fault.node)
            if self.cfg.kube_events == "on" and c.kind in (ChangeKind.OCCUR, ChangeKind.RECOVER):
                if len(self._events) == self._events.maxlen:
                    self.events_dropped.inc()
                occur = c.kind == ChangeKind.OCCUR
                self._events.append(
                    (
                        c.fault.node,
                        "FaultOccurred" if occur else "FaultRecovered",
                        "Warning" if occur else "Normal",
                        f"{'fault' if occur else 'recovered'}: {_describe(c.fault)} (source {c.fault.source})",
                    )
                )
        self.due.set()

    def on_resync(self, faults) -> None:
        """Fell behind: recompute every node (events of the lost batches are lost, counted)."""
        self.events_dropped.inc()
        self.mark_all()

    def mark(self, node: str) -> None:
        """``node``'s signals need a look (a Node appeared, its agent status changed)."""
        self._dirty.add(node)
        self.due.set()

    def mark_all(self) -> None:
        self._dirty |= self.center.node_names() | set(self._conds) | self._tainted | self.nodes.names()
        self.due.set()

    def forget(self, node: str) -> None:
        """The Node was deleted."""
        self._conds.pop(node, None)
        self._tainted.discard(node)

    # -- writing ---------------------------------------------------------------------------------
    async def _conditions(self, node: str) -> None:
        assert self.api is not None
        want = conditions_of(self.center.faults_of_node(node))
        old = self._conds.get(node, {})
        if old == want:
            return
        now = _now()
        body = []
        for t, (status, reason, message) in want.items():
            cond = {
                "type": t,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
            }
            if t not in old or old[t][0] != status:
                cond["lastTransitionTime"] = now
            body.append(cond)
        await self.api.patch_node_status(node, {"status": {"conditions": body}})
        self.metrics.writes.labels("node_condition", "ok").inc()
        self._conds[node] = want

    async def _taint(self, node: str) -> None:
        assert self.api is not None
        key = self.cfg.kube_taint_key
        want = self.cfg.kube_taint == "on" and self.nodes.health(node).health == UNHEALTHY
        have = node in self._tainted
        if want == have:
            return
        if want:
            limit = int(self.cfg.kube_taint_max_share * max(1, self.node_count()))
            if len(self._tainted) + 1 > limit:
                if not self._breaker_open:
                    event(
                        log,
                        logging.WARNING,
                        "taint circuit breaker open",
                        node=node,
                        tainted=len(self._tainted),
                        limit=limit,
                    )
                self._breaker_open = True
                self.breaker.set(1)
                return
        taints = [t for t in self.node_taints(node) if t.get("key") != key]
        if want:
            taints.append({"key": key, "value": UNHEALTHY, "effect": "NoSchedule"})
        await self.api.patch_node(node, {"spec": {"taints": taints}})
        self.metrics.writes.labels("node_taint", "ok").inc()
        event(
            log,
            logging.WARNING if want else logging.INFO,
            "node tainted" if want else "node untainted",
            node=node,
        )
        if want:
            self._tainted.add(node)
        else:
            self._tainted.discard(node)
            if self._breaker_open:
                self._breaker_open = False
                self.breaker.set(0)
                self.mark_all()  # room again: nodes held back get their taint

    async def _send_events(self) -> None:
        assert self.api is not None
        ns = self.cfg.kube_event_namespace
        while self._events:
            node, reason, etype, message = self._events[0]
            if not self.known_node(node):
                self._events.popleft()
                continue
            if not self._bucket.take():
                self.events_dropped.inc()
                self._events.popleft()
                continue
            now = _now()
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{node}.{time.time_ns():x}", "namespace": ns},
                "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
                "reason": reason,
                "message": message[:1024],
                "type": etype,
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            await self.api.create_event(ns, body)
            self._events.popleft()
            self.metrics.writes.labels("event", "ok").inc()

    async def write_once(self) -> None:
        """Write every dirty node's conditions and taint, then the queued events. Raises :class:`KubeError`."""
        dirty, self._dirty = sorted(self._dirty), set()
        for i, node in enumerate(dirty):
            if not self.known_node(node):
                continue
            try:
                if self.cfg.kube_conditions == "on":
                    await self._conditions(node)
                await self._taint(node)
            except KubeError as e:
                if e.status == 404:
                    continue  # the Node is gone; its delete event forgets it
                self._dirty.update(dirty[i:])
                raise
        if self.cfg.kube_events == "on":
            await self._send_events()

    async def run(self) -> None:
        """Write whenever :attr:`due` is set, until cancelled; errors back off and retry."""

        def failed(e: KubeError) -> None:
            self.metrics.writes.labels("node_signal", "error").inc()
            self.metrics.api_errors.labels(e.op, str(e.status)).inc()

        await run_when_due(self.due, self.write_once, "node signal write failed, retrying", failed)
