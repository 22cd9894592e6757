"""The fault center's in-memory state: every active fault with the indexes its readers use (issue 18:
every read costs what it returns, not a scan of every fault).

:class:`FaultIndex` holds faults by key with their owner (*origin*), and per node, per scope
(node, origin), per origin, per code and per level; node health is computed once per change of a
node's faults. Every put or drop marks the node in :attr:`FaultIndex.node_changes` (the scrape
caches, :mod:`clusterd.pieces`). :class:`~clusterd.center.FaultCenter` holds one as ``index``, and
only its writer changes it (:meth:`FaultIndex.put`, :meth:`FaultIndex.drop`, :meth:`FaultIndex.undo`);
every other holder only reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set

from clusterd.pieces import NodeChanges
from faultmesh.levels import HEALTHY, level_health, level_severity, worst_health
from faultmesh.model import Fault, FaultKey

_EMPTY: frozenset = frozenset()


class FaultIndex:
    """Active faults and their indexes (module docstring); the reads of the fault center."""

    def __init__(self) -> None:
        self._faults: dict[FaultKey, Fault] = {}
        self._origin: dict[FaultKey, str] = {}
        self._by_scope: dict[tuple[str, str], set[FaultKey]] = {}
        self._by_node: dict[str, dict[FaultKey, Fault]] = {}  # node -> its faults
        self._origin_n: dict[str, int] = {}  # origin -> its records
        self._groups: dict[str, dict[tuple[str, str], int]] = {}  # origin -> (node, source) -> records
        self._level_counts: dict[str, int] = {}
        self._health: dict[str, tuple[str, str]] = {}  # node -> (health, worst level), while unchanged
        self._code_nodes: dict[str, dict[str, int]] = {}  # code -> node -> its records of that code
        self.node_changes = NodeChanges()  # every node whose faults changed (scrape caches, issue 18)
        # The two key maps as read-only views, for the writer's per-fault lookups (a dict's own get,
        # no call of :meth:`get` / :meth:`origin` per fault on the ingest path).
        self.fault_of: Mapping[FaultKey, Fault] = self._faults
        self.origin_of: Mapping[FaultKey, str] = self._origin

    # -- the writer's changes -------------------------------------------------------------------
    def undo(self, undo: dict[FaultKey, tuple[Fault | None, str | None]]) -> None:
        """Put memory back as it was before a batch whose commit failed (memory == file again):
        ``undo`` maps each key the batch touched to its (fault, origin) before it (None: absent)."""
        for key, (fault, origin) in undo.items():
            self.drop(key)
            if fault is not None:
                self.put(fault, origin or fault.source)

    def put(self, f: Fault, origin: str, key: FaultKey | None = None) -> None:
        """Hold ``f`` (under ``key``, its own key by default) as owned by ``origin``, replacing the
        fault held under that key; the indexes and the node's change mark follow."""
        key = key or f.key
        old = self._faults.get(key)
        old_origin = self._origin.get(key)
        if old_origin != origin:
            if old_origin is not None:
                self._by_scope.get((f.node, old_origin), set()).discard(key)
                self._count_drop(key, old_origin)
            self._origin_n[origin] = self._origin_n.get(origin, 0) + 1
            groups = self._groups.setdefault(origin, {})
            groups[(f.node, f.source)] = groups.get((f.node, f.source), 0) + 1
            self._origin[key] = origin
            self._by_scope.setdefault((f.node, origin), set()).add(key)
        self._faults[key] = f
        if old is None:
            self._index_add(f, key)
        else:  # the same key: same node and code; only the level's counts and health may move
            self._by_node[f.node][key] = f
            if old.level != f.level:
                counts = self._level_counts
                n = counts[old.level] - 1
                if n:
                    counts[old.level] = n
                else:
                    del counts[old.level]
                counts[f.level] = counts.get(f.level, 0) + 1
                self._health.pop(f.node, None)
            self.node_changes.mark(f.node)

    def drop(self, key: FaultKey) -> Fault | None:
        """Forget the fault held under ``key`` (and its owner); returns it (None: none held)."""
        f = self._faults.pop(key, None)
        if f is not None:
            self._index_drop(f, key)
        origin = self._origin.pop(key, None)
        if origin is not None:
            self._count_drop(key, origin)
            scope = self._by_scope.get((key.node, origin))
            if scope is not None:
                scope.discard(key)
                if not scope:
                    del self._by_scope[(key.node, origin)]
        return f

    def _count_drop(self, key: FaultKey, origin: str) -> None:
        n = self._origin_n.get(origin, 0) - 1
        if n > 0:
            self._origin_n[origin] = n
        else:
            self._origin_n.pop(origin, None)
        groups = self._groups.get(origin, {})
        g = groups.get((key.node, key.source), 0) - 1
        if g > 0:
            groups[(key.node, key.source)] = g
        else:
            groups.pop((key.node, key.source), None)

    def _index_add(self, f: Fault, key: FaultKey) -> None:
        self._level_counts[f.level] = self._level_counts.get(f.level, 0) + 1
        node = self._by_node.setdefault(f.node, {})
        node[key] = f
        self._health.pop(f.node, None)
        self.node_changes.mark(f.node)
        nodes = self._code_nodes.setdefault(f.code, {})
        nodes[f.node] = nodes.get(f.node, 0) + 1

    def _index_drop(self, f: Fault, key: FaultKey) -> None:
        n = self._level_counts.get(f.level, 0) - 1
        if n > 0:
            self._level_counts[f.level] = n
        else:
            self._level_counts.pop(f.level, None)
        node = self._by_node.get(f.node)
        if node is not None:
            node.pop(key, None)
            if not node:
                del self._by_node[f.node]
        self._health.pop(f.node, None)
        self.node_changes.mark(f.node)
        nodes = self._code_nodes.get(f.code)
        if nodes is not None:
            k = nodes.get(f.node, 0) - 1
            if k > 0:
                nodes[f.node] = k
            else:
                nodes.pop(f.node, None)
                if not nodes:
                    del self._code_nodes[f.code]

    # -- reads -----------------------------------------------------------------------------------
    def faults(self, node: str | None = None) -> list[Fault]:
        """Active faults (optionally of one node), sorted by node, device, code, source."""
        items = self._faults.values() if node is None else self._by_node.get(node, {}).values()
        return sorted(items, key=lambda f: (f.node, f.device_type, f.device_id, f.code, f.source))

    def faults_of_node(self, node: str) -> list[Fault]:
        """Active faults of ``node`` (unsorted; cost follows that node's faults)."""
        return list(self._by_node.get(node, {}).values())

    def fault_count(self, node: str) -> int:
        """How many active faults ``node`` has (O(1), read-only: the node list's count)."""
        return len(self._by_node.get(node, ()))

    def faults_of_origin(self, origin: str) -> list[Fault]:
        """Every active fault owned by ``origin`` (unsorted; cost follows that origin's faults)."""
        return [self._faults[k] for (_, o), keys in self._by_scope.items() if o == origin for k in keys]

    def scope_keys(self, scope: tuple[str, str]) -> Set[FaultKey]:
        """The keys scope (node, origin) holds: the live set, read it before the next change and
        never change it (O(1))."""
        return self._by_scope.get(scope, _EMPTY)

    def level_counts(self) -> dict[str, int]:
        """Active records per level (a copy; the ``faultmesh_faults_active`` gauge)."""
        return dict(self._level_counts)

    def scope_count_with(
        self, node: str, origin: str, add: Iterable[FaultKey], remove: Iterable[FaultKey] = ()
    ) -> int:
        """How many records scope (``node``, ``origin``) would hold with the keys ``add`` put and
        ``remove`` dropped (cost follows the keys given, not what the scope holds)."""
        held = self._by_scope.get((node, origin), _EMPTY)
        gone = {k for k in remove if k in held}
        return len(held) - len(gone) + len({k for k in add if k not in held or k in gone})

    def count_of_origin(self, origin: str) -> int:
        """How many records ``origin`` owns (O(1))."""
        return self._origin_n.get(origin, 0)

    def groups_of_origin(self, origin: str) -> int:
        """How many distinct (node, source) pairs ``origin`` owns (O(1)); for PubFault one pair is
        one reference cache item: one influence entry of one faultId on one node."""
        return len(self._groups.get(origin, ()))

    def has_group(self, origin: str, node: str, source: str) -> bool:
        """True when ``origin`` owns at least one record of ``source`` on ``node``."""
        return (node, source) in self._groups.get(origin, {})

    def __len__(self) -> int:
        return len(self._faults)

    def get(self, key: FaultKey) -> Fault | None:
        """The active fault with ``key``, or None."""
        return self._faults.get(key)

    def origin(self, key: FaultKey) -> str | None:
        """Who owns the fault with ``key``."""
        return self._origin.get(key)

    def node_names(self) -> set[str]:
        """Every node that has at least one active fault."""
        return set(self._by_node)

    def nodes_with_code(self, code: str) -> set[str]:
        """Every node with at least one active fault of ``code`` (a maintained index: cost follows
        those nodes, not all faults)."""
        return set(self._code_nodes.get(code, ()))

    def node_health(self, node: str) -> tuple[str, str]:
        """(health, worst level) of ``node`` from its faults: Healthy / SubHealthy / UnHealthy.
        Computed once per change of the node's faults (kept until the next), so a scrape of every
        node costs a lookup per node (issue 18)."""
        got = self._health.get(node)
        if got is not None:
            return got
        faults = self._by_node.get(node)
        if not faults:
            return HEALTHY, ""
        worst = max(faults.values(), key=lambda f: level_severity(f.level)).level
        got = self._health[node] = (worst_health(level_health(f.level) for f in faults.values()), worst)
        return got
