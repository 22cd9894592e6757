"""The node registry: what ClusterD knows about each node besides its faults (issue 12).

One :class:`NodeRegistry` per ClusterD holds a typed :class:`NodeState` per node: identity from the
agent's Hello (ip, serial number, boot id), the node status each reporter gave (the agents
``"agent"``, Kubernetes node-info ConfigMaps ``"kube:nodeinfo"``), the conditions and the device
states of the agents' snapshots and deltas. It is persisted in the store's ``nodes`` table (flushed
once per ``flush_s`` and at shutdown), so a restarted ClusterD resolves serial numbers and serves
``/v1/nodes`` before the agents reconnect.

:meth:`NodeRegistry.health` is the one answer to "how healthy is this node": the worst of its faults
(clusterd.md §2.4 level -> health) and UnHealthy when any reporter says so. The HTTP node view,
the ``faultmesh_node_unhealthy`` gauge and the Kubernetes node annotation all read it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter

from clusterd.center import FaultCenter
from clusterd.store import Store
from faultmesh.levels import HEALTHY, SUB_HEALTHY, UNHEALTHY
from faultmesh.log import RateLimitedLog, event

log = logging.getLogger("clusterd.nodes")

HEALTH_STATES = (HEALTHY, SUB_HEALTHY, UNHEALTHY)

AGENT = "agent"  # the node status reporter of the agent stream
SLOW_NODE_CODE = "110001010"


@dataclass
class NodeState:
    """What the reporters last said about one node (faults live in the fault center).

    ``status``: reporter -> node status string (``Healthy`` / ``SubHealthy`` / ``UnHealthy``);
    ``conditions``: type -> condition view (type, active, reason, message, since_ms); ``devices``:
    ``"<type>-<id>"`` -> device view (device_type, device_id, phy_id, health, network_health, level,
    super_pod_id, server_index); ``pending``: agent -> the fault sources that have not completed
    their first poll since that agent started (their faults are the last ones known, issue 20);
    ``stale``: agent -> ``{"reason": "NoHeartbeat" | "Disconnected", "since_ms"}`` for the agents
    whose data is no longer current (hung or gone; their faults are kept); ``agent_seen_ms``: agent
    -> when it last said Hello or its stream ended (epoch ms, persisted: the clock of
    :meth:`NodeRegistry.expired_agents`); ``labels``: agent -> its last Hello's labels (its modes,
    e.g. deviced's ``graceTolerance=on``: :mod:`faultmesh.exclusions`; persisted). The views are the JSON objects of ``GET /v1/nodes/<name>``.
    """

    name: str
    node_ip: str = ""
    node_sn: str = ""
    boot_id: str = ""
    status: dict[str, str] = field(default_factory=dict)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: dict[str, list[str]] = field(default_factory=dict)  # agent -> sources not polled yet
    stale: dict[str, dict[str, Any]] = field(default_factory=dict)  # agent -> {reason, since_ms}
    agent_seen_ms: dict[str, int] = field(default_factory=dict)  # agent -> last hello / disconnect (ms)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # agent -> its Hello's labels
    # which agent said each view ("c:<type>" / "d:<type>-<id>" -> agent): a snapshot replaces only
    # its own agent's views (noded's BMC conditions survive a deviced snapshot, and the other way)
    owners: dict[str, str] = field(default_factory=dict)

    @property
    def node_status(self) -> str:
        """The status the node's agent reported ("" when none)."""
        return self.status.get(AGENT, "")

    def to_json(self) -> dict[str, Any]:
        """The persisted form (and the shape :meth:`from_json` reads). Shallow: the nested views are
        this state's own dicts, to be serialized at once (``dataclasses.asdict`` deep-copied every
        device view: 2/3 of a 1k-agent resync's CPU, issue 18)."""
        return {
            "node_ip": self.node_ip,
            "node_sn": self.node_sn,
            "boot_id": self.boot_id,
            "status": self.status,
            "conditions": self.conditions,
            "devices": self.devices,
            "pending": self.pending,
            "stale": self.stale,
            "owners": self.owners,
            "agent_seen_ms": self.agent_seen_ms,  # the expiry clocks (from_json reads them back)
            "labels": self.labels,
        }

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> NodeState:
        """Rebuild from :meth:`to_json` output; unknown keys are ignored."""
        return cls(
            name=name,
            node_ip=str(d.get("node_ip", "")),
            node_sn=str(d.get("node_sn", "")),
            boot_id=str(d.get("boot_id", "")),
            status={str(k): str(v) for k, v in (d.get("status") or {}).items()},
            conditions=dict(d.get("conditions") or {}),
            devices=dict(d.get("devices") or {}),
            agent_seen_ms={str(k): int(v) for k, v in (d.get("agent_seen_ms") or {}).items()},
            owners={str(k): str(v) for k, v in (d.get("owners") or {}).items()},
            labels={
                str(a): {str(k): str(v) for k, v in ls.items()}
                for a, ls in (d.get("labels") or {}).items()
                if isinstance(ls, dict)
            },
        )

    def views_of(self, owner: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(conditions, devices) that ``owner`` said (views without a recorded owner count as its)."""
        own = self.owners
        return (
            [v for k, v in self.conditions.items() if own.get("c:" + k, owner) == owner],
            [v for k, v in self.devices.items() if own.get("d:" + k, owner) == owner],
        )


class NodeHealth(NamedTuple):
    """``health``: Healthy / SubHealthy / UnHealthy; ``worst_level``: worst fault level ("" if none)."""

    health: str
    worst_level: str


def with_status(health: tuple[str, str], st: NodeState | None) -> tuple[str, str]:
    """The one node-health rule: over the fault center's ``(health, worst level)`` of a node (the
    worst of its faults' health) and the node's state, UnHealthy when any reporter's node status
    says so. Cheap enough for the per-node loops of a scrape."""
    if st is not None and st.status and UNHEALTHY in st.status.values():
        return UNHEALTHY, health[1]
    return health


class NodeRegistry:
    """Every node ClusterD heard of, with one :meth:`health`. Load with :meth:`load`, run :meth:`run`.
    ``registry``: where ``faultmesh_node_ip_changes_total`` is counted (a private one when None)."""

    def __init__(
        self,
        store: Store,
        center: FaultCenter,
        flush_s: float = 1.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._store = store
        self._faults = center.index  # the center's faults, read only (node names, health)
        self._changes = self._faults.node_changes  # what the scrape caches re-render (clusterd.pieces)
        self._nodes: dict[str, NodeState] = {}
        self._dirty: set[str] = set()
        self._flush_lock = asyncio.Lock()
        self._gone: set[str] = set()  # forgotten nodes whose stored row is still to delete
        self._wake = asyncio.Event()
        self.flush_s = flush_s
        self.clock = time.time  # epoch seconds of the expiry clocks (tests move it)
        self._ratelog = RateLimitedLog(log)  # a full disk fails every flush: one line a minute
        self._started_ms = int(self.clock() * 1000)  # no expiry clock starts before this process
        self.ip_changes = Counter(
            "faultmesh_node_ip_changes_total",
            "Hellos that changed a node's known IP (two agents of one node disagreeing, or the node moved)",
            registry=registry or CollectorRegistry(),
        )

    # -- lifecycle -------------------------------------------------------------------------------
    async def load(self) -> int:
        """Read the persisted nodes. Returns how many."""
        for name, d in (await self._store.load_nodes()).items():
            self._nodes[name] = NodeState.from_json(name, d)
            self._changes.mark(name)
        return len(self._nodes)

    async def flush(self) -> None:
        """Write the nodes changed since the last flush and delete the rows of forgotten ones.
        Raises ``sqlite3.Error`` (what was not written is retried by the next flush). One flush at a
        time: the writer loop's and the shutdown's may overlap, and a node row written by one after the
        other deleted it would bring a forgotten node back at the next start."""
        async with self._flush_lock:
            if not self._dirty and not self._gone:
                return
            names, self._dirty = self._dirty, set()
            gone, self._gone = self._gone, set()
            try:
                rows = {n: self._nodes[n].to_json() for n in names if n in self._nodes}
                await self._store.write_nodes(rows)
                if gone:
                    await self._store.delete_nodes(sorted(gone - set(self._nodes)))
            except BaseException:
                self._dirty |= names
                self._gone |= gone - set(self._nodes)
                raise

    async def run(self) -> None:
        """Flush changes at most once per ``flush_s`` until cancelled (a failed write is retried)."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.flush_s)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as e:  # disk full: memory stays right, retried next round
                self._ratelog.log(logging.ERROR, "node_state_write", "node state write failed", error=repr(e))
                self._wake.set()

    def _touch(self, node: str) -> None:
        self._dirty.add(node)
        self._gone.discard(node)
        self._wake.set()
        self._changes.mark(node)

    def _new(self, node: str) -> NodeState:
        st = self._nodes[node] = NodeState(node)
        self._changes.mark(node)  # a new node is listed even before it is written
        return st

    # -- writes ----------------------------------------------------------------------------------
    def hello(
        self,
        node: str,
        node_ip: str,
        node_sn: str,
        boot_id: str,
        agent: str = "",
        labels: dict[str, str] | None = None,
    ) -> NodeState:
        """``agent`` said hello from ``node``: record its identity and ``labels`` (its Hello's: they
        replace what it said before). Returns the node's state.

        An empty ``node_ip`` or ``node_sn`` keeps the known one (an agent that was not told, such as
        deviced beside a noded that reads the SN from the BMC). A different IP replaces the known
        one (the later Hello wins: the node may have moved), logged as ``node ip changed`` with the
        old and new value and counted in ``faultmesh_node_ip_changes_total`` (issue 29)."""
        st = self._nodes.get(node) or self._new(node)
        node_ip, node_sn = node_ip or st.node_ip, node_sn or st.node_sn
        if st.node_ip and node_ip != st.node_ip:
            self.ip_changes.inc()
            event(
                log, logging.WARNING, "node ip changed", node=node, agent=agent, old=st.node_ip, new=node_ip
            )
        if (st.node_ip, st.node_sn, st.boot_id) != (node_ip, node_sn, boot_id):
            st.node_ip, st.node_sn, st.boot_id = node_ip, node_sn, boot_id
            self._touch(node)  # a reconnect with the same identity writes nothing
        labels = dict(labels or {})
        if st.labels.get(agent, {}) != labels:
            if labels:
                st.labels[agent] = labels
            else:
                st.labels.pop(agent, None)
            event(log, logging.INFO, "agent labels", node=node, agent=agent, labels=sorted(labels.items()))
            self._touch(node)
        return st

    def labelled(self, node: str, test: Callable[[dict[str, str]], bool]) -> bool:
        """Whether one of ``node``'s agents said Hello with labels that pass ``test``."""
        st = self._nodes.get(node)
        return st is not None and any(test(ls) for ls in st.labels.values())

    def agent_seen(self, node: str, agent: str) -> None:
        """``agent`` of ``node`` said Hello or its stream just ended: restart its expiry clock."""
        st = self._nodes.get(node) or self._new(node)
        st.agent_seen_ms[agent] = int(self.clock() * 1000)
        self._touch(node)

    def expired_agents(self, older_than_s: float, live: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """(node, agent) of every agent not in ``live`` (open streams) whose clock
        (:meth:`agent_seen`, never before this process started) is more than ``older_than_s`` old."""
        live = set(live)
        cutoff = int((self.clock() - older_than_s) * 1000)
        return sorted(
            (n, a)
            for n, st in self._nodes.items()
            for a, ms in st.agent_seen_ms.items()
            if (n, a) not in live and max(ms, self._started_ms) < cutoff
        )

    def forget_agent(self, node: str, agent: str) -> bool:
        """Drop what ``agent`` said about ``node`` (its clock, stale and pending marks); the node's
        whole entry (identity, conditions, devices, statuses) goes with its last agent, also from the
        store at the next flush. Returns True when the node entry was dropped."""
        st = self._nodes.get(node)
        if st is None:
            return False
        st.agent_seen_ms.pop(agent, None)
        st.stale.pop(agent, None)
        st.pending.pop(agent, None)
        st.labels.pop(agent, None)
        if st.agent_seen_ms:
            self._touch(node)
            return False
        del self._nodes[node]
        self._dirty.discard(node)
        self._gone.add(node)
        self._wake.set()
        self._changes.mark(node)
        return True

    def update(
        self,
        node: str,
        *,
        conditions: Iterable[dict[str, Any]] = (),
        devices: Iterable[dict[str, Any]] = (),
        status: str = "",
        reporter: str = AGENT,
        replace: bool = False,
        owner: str = "",
    ) -> NodeState:
        """Merge conditions/devices (views keyed by type / ``<type>-<id>``) said by agent ``owner``
        into ``node``; ``replace`` makes them the whole set of ``owner``'s views (a snapshot: the
        views of the node's other agents stay). A non-empty ``status`` is ``reporter``'s node status."""
        st = self._nodes.get(node) or self._new(node)
        conds = {c["type"]: c for c in conditions}
        devs = {f"{d['device_type']}-{d['device_id']}": d for d in devices}
        changed = False
        own = st.owners
        for prefix, have, new in (("c:", st.conditions, conds), ("d:", st.devices, devs)):
            if replace:  # owner's views not in the snapshot go
                for k in [k for k in have if k not in new and own.get(prefix + k, owner) == owner]:
                    del have[k]
                    own.pop(prefix + k, None)
                    changed = True
            for k, v in new.items():
                if have.get(k) != v:
                    have[k] = v
                    changed = True
                if owner and own.get(prefix + k) != owner:
                    own[prefix + k] = owner
                    changed = True
        if status and st.status.get(reporter) != status:
            st.status[reporter] = status
            changed = True
        if changed:  # an unchanged snapshot (a resync after a restart) writes nothing
            self._touch(node)
        return st

    def set_pending(self, node: str, agent: str, sources: Iterable[str]) -> None:
        """``agent``'s fault sources on ``node`` that have not completed their first poll (empty: none)."""
        st = self._nodes.get(node) or self._new(node)
        new = sorted(sources)
        if st.pending.get(agent, []) != new:
            if new:
                st.pending[agent] = new
            else:
                st.pending.pop(agent, None)
            self._touch(node)

    def set_stale(self, node: str, agent: str, reason: str | None, since_ms: int | None = None) -> None:
        """Mark ``agent``'s data on ``node`` stale (``reason``: NoHeartbeat, Disconnected; since
        ``since_ms``, default now) or, with None, current again."""
        st = self._nodes.get(node)
        if st is None:
            if reason is None:
                return
            st = self._new(node)
        if reason is None:
            if st.stale.pop(agent, None) is not None:
                self._touch(node)
            return
        st.stale[agent] = {"reason": reason, "since_ms": since_ms or int(time.time() * 1000)}
        self._touch(node)

    def stale_conditions(self, node: str) -> list[dict[str, Any]]:
        """One active ``AgentStale`` condition view per stale agent of ``node`` (reason, since_ms)."""
        st = self._nodes.get(node)
        if st is None:
            return []
        return [
            {
                "type": "AgentStale",
                "active": True,
                "reason": v["reason"],
                "message": f"{agent}: its data is no longer current (faults kept)",
                "since_ms": v["since_ms"],
                "agent": agent,
            }
            for agent, v in sorted(st.stale.items())
        ]

    def stale_agents(self) -> list[tuple[str, str]]:
        """(node, agent) of every stale agent."""
        return sorted((n, a) for n, st in self._nodes.items() for a in st.stale)

    def pending_sources(self, node: str) -> list[str]:
        """``"<agent>/<source>"`` for every source of ``node`` still pending its first poll."""
        st = self._nodes.get(node)
        if st is None:
            return []
        return [f"{a}/{src}" for a, srcs in sorted(st.pending.items()) for src in srcs]

    def set_status(self, node: str, reporter: str, status: str | None) -> None:
        """Set (or with None/"" clear) ``reporter``'s status of ``node``."""
        st = self._nodes.get(node)
        if not status:
            if st is not None and st.status.pop(reporter, None) is not None:
                self._touch(node)
            return
        if st is None:
            st = self._new(node)
        if st.status.get(reporter) != status:
            st.status[reporter] = status
            self._touch(node)

    def put(self, state: NodeState) -> None:
        """Replace a node's whole state (tests, imports)."""
        self._nodes[state.name] = state
        self._touch(state.name)

    # -- reads -----------------------------------------------------------------------------------
    def get(self, node: str) -> NodeState | None:
        """The node's state, or None when no reporter ever mentioned it."""
        return self._nodes.get(node)

    def __contains__(self, node: object) -> bool:
        return node in self._nodes

    def names(self) -> set[str]:
        """Every node in the registry."""
        return set(self._nodes)

    def all_names(self) -> set[str]:
        """Nodes of the registry plus nodes that have faults."""
        return self.names() | self._faults.node_names()

    def by_sn(self) -> dict[str, str]:
        """Serial number -> node, for the nodes whose agent gave one."""
        return {st.node_sn: n for n, st in self._nodes.items() if st.node_sn}

    def status(self, node: str, prefer: str = AGENT) -> str:
        """``prefer``'s node status of ``node``, else the agent's, else ""."""
        st = self._nodes.get(node)
        if st is None:
            return ""
        return st.status.get(prefer) or st.status.get(AGENT, "")

    def health(self, node: str) -> NodeHealth:
        """The node's health (:func:`with_status`)."""
        return NodeHealth(*with_status(self._faults.node_health(node), self._nodes.get(node)))

    def unhealthy(self) -> set[str]:
        """Every UnHealthy node (by :meth:`health`)."""
        candidates = {n for n, st in self._nodes.items() if st.status} | self._faults.node_names()
        return {n for n in candidates if self.health(n).health == UNHEALTHY}

    def info(self, node: str) -> dict[str, Any]:
        """The node's state as a JSON-shaped dict (node_ip, node_sn, boot_id, node_status, conditions,
        devices); {} when unknown."""
        st = self._nodes.get(node)
        if st is None:
            return {}
        return {
            "node_ip": st.node_ip,
            "node_sn": st.node_sn,
            "boot_id": st.boot_id,
            "node_status": st.node_status,
            "conditions": st.conditions,
            "devices": st.devices,
        }
