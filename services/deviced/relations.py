"""Relation faults and their deadlines (``relationFaultCustomization.json`` + ``faultDuration.json``),
applied per node in deviced (reference clusterd.md §6.3; the reference evaluates them per job in
ClusterD's job centre, ``relation_fault_processor.go``).

A *relation fault* (e.g. link down 81078603, or the switch L2 link down ``[0x08520003,na,L2,na]``)
is watched from the cycle it is first seen, for its ``faultDuration.json`` deadline
(``TimeOutInterval`` s; 0 when the code has no entry). While it waits, a rule whose trigger (a chip
code such as the HCCL fault 8C1F860B) is present on any chip of the node and all of whose relation
codes are present fires: every watched fault carrying those codes gets the rule's strategy
(Separate dominates SubHealth). A fault that reaches its deadline without a Separate strategy is
settled by the default of the reference: a switch relation fault becomes SubHealth; a chip relation
fault becomes Separate only if an A3 CQE trigger (8C1F8608 / 4C1F8608 on a super-pod node) was seen
within [first seen, first seen + deadline], else it stays as it is. A strategy holds until the
relation fault leaves.

What a strategy does here:

- chip relation fault: an escalation of kind :data:`RELATION` on that code (Separate -> SeparateNPU,
  SubHealth -> SubHealthFault), through the engine's reason API, so the reported fault's level, the
  chip's (network) health and ``attributes["upgrade"]`` follow;
- switch relation fault: the switch fault's level is raised (Separate / SubHealthFault) through
  ``SwitchState.overrides``.

Like the reference: chips whose health is UnHealthy contribute neither relation faults nor
triggers (the reference's CardUnhealthy chips), and a node whose
switch status (from the switch table, without these overrides) is UnHealthy contributes no chip
faults at all. faultmesh difference: the scope is one node (deviced sees no other node); a trigger
on another node of the same job is not seen.

Hooked into the engine with ``engine.add_stage(RelationRules(...))`` (:meth:`FaultEngine.add_stage`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deviced.state import UpgradeReason
from deviced.switch import SwitchState
from deviced.tables import SWITCH_LEVEL_RANK, SWITCH_NODE_STATUS, parse_code, switch_code
from faultmesh.faultrules import DurationTable, RelationTable, canonical_code, is_switch_code
from faultmesh.levels import NpuLevel
from faultmesh.log import event

if TYPE_CHECKING:
    from deviced.engine import FaultEngine

log = logging.getLogger("deviced.relations")

RELATION = "RelationFault"
"""Upgrade-reason kind of a relation-fault strategy (not persisted: re-derived from live faults)."""
SEPARATE, SUBHEALTH = "Separate", "SubHealth"
CHIP_LEVEL = {SEPARATE: NpuLevel.SeparateNPU, SUBHEALTH: NpuLevel.SubHealthFault}
SWITCH_LEVEL = {SEPARATE: "Separate", SUBHEALTH: "SubHealthFault"}
CQE_TRIGGERS = frozenset({"8C1F8608", "4C1F8608"})
SWITCH_WIDE = -1  # the reference's npu id "FF": a switch fault belongs to the whole node
MAX_CQE_SIGHTINGS = 4096


@dataclass
class Watched:
    """One relation fault being watched: canonical ``code``, chip ``logic`` id (``SWITCH_WIDE`` for
    a switch fault), ``since_ms`` (first seen), ``deadline_ms`` (its faultDuration.json interval),
    ``strategy`` (None, SubHealth or Separate) and whether its deadline passed."""

    code: str
    logic: int
    since_ms: int
    deadline_ms: int
    strategy: str | None = None
    timed_out: bool = False

    @property
    def waiting(self) -> bool:
        """Still open to rule matches: not timed out and not already Separate."""
        return not self.timed_out and self.strategy != SEPARATE


def _stronger(a: str | None, b: str) -> str:
    return SEPARATE if SEPARATE in (a, b) else b


class RelationRules:
    """The relation-fault stage of the engine cycle (see module docstring).

    ``relations`` / ``durations``: the parsed tables (:func:`deviced.tables.load_relations`,
    :func:`deviced.tables.load_fault_duration`); ``switch``: the node's switch state (None: no switch);
    ``a3()``: True on a super-pod (A3) node, where CQE triggers only settle timed-out faults.
    ``stats`` counts ``matched`` / ``timed_out`` / ``settled`` events."""

    def __init__(
        self,
        relations: RelationTable,
        durations: DurationTable,
        switch: SwitchState | None = None,
        a3: Callable[[], bool] = lambda: False,
    ) -> None:
        self.switch = switch
        self.a3 = a3
        self.watched: dict[tuple[int, str], Watched] = {}
        self.cqe_seen: collections.deque[int] = collections.deque(maxlen=MAX_CQE_SIGHTINGS)
        self.stats: collections.Counter[str] = collections.Counter()
        self._pending_reset = False
        self.set_tables(relations, durations)

    def set_tables(
        self, relations: RelationTable | None = None, durations: DurationTable | None = None
    ) -> None:
        """Adopt new tables (a reload); the watched faults start over on the next cycle."""
        if relations is not None:
            self.relations = relations
        if durations is not None:
            self.durations = durations
        self.relation_codes = {c for r in self.relations.rules for c in r.relations}
        self.trigger_codes = {r.trigger for r in self.relations.rules}
        self._chip: dict[int, str] = {}
        for c in self.relation_codes | self.trigger_codes:
            if not is_switch_code(c):
                self._chip[parse_code(c)] = c
        self._pending_reset = bool(self.watched)

    def next_due_ms(self) -> int | None:
        """When the earliest watched fault reaches its deadline (engine ms), or None."""
        due = [w.since_ms + w.deadline_ms for w in self.watched.values() if w.waiting]
        return min(due) if due else None

    # -- one cycle ---------------------------------------------------------------------------------
    def run(self, eng: FaultEngine, now: int) -> set[int]:
        """Collect, match, time out and apply (module docstring). Returns the logic ids whose
        escalations changed (the engine recomputes their levels)."""
        changed: set[int] = set()
        if self._pending_reset:
            for key in list(self.watched):
                changed |= self._forget(eng, key)
            self._pending_reset = False
        present, triggers = self._collect(eng, now)
        for key in [k for k in self.watched if k not in present]:
            changed |= self._forget(eng, key)
        for key in present:
            if key not in self.watched:
                code = key[1]
                self.watched[key] = Watched(code, key[0], now, self.durations.timeout_s(code) * 1000)
        live = {w.code for w in self.watched.values() if w.waiting}
        for rule in self.relations.rules:
            if rule.trigger not in triggers or not all(c in live for c in rule.relations):
                continue
            for w in self.watched.values():
                if (
                    w.waiting
                    and w.code in rule.relations
                    and w.strategy != _stronger(w.strategy, rule.strategy)
                ):
                    w.strategy = _stronger(w.strategy, rule.strategy)
                    self.stats["matched"] += 1
                    event(
                        log, logging.WARNING, "relation fault matched", code=w.code, logic_id=w.logic,
                        trigger=rule.trigger, strategy=w.strategy,
                    )  # fmt: skip
        for w in self.watched.values():
            if w.waiting and now - w.since_ms >= w.deadline_ms:
                w.timed_out = True
                self.stats["timed_out"] += 1
                if w.strategy is None:
                    if w.logic == SWITCH_WIDE:
                        w.strategy = SUBHEALTH
                    elif any(w.since_ms <= t <= w.since_ms + w.deadline_ms for t in self.cqe_seen):
                        w.strategy = SEPARATE
                    if w.strategy is not None:
                        self.stats["settled"] += 1
                event(
                    log, logging.INFO, "relation fault timed out", code=w.code, logic_id=w.logic,
                    strategy=w.strategy or "",
                )  # fmt: skip
        for w in self.watched.values():
            changed |= self._apply(eng, w)
        return changed

    def _collect(self, eng: FaultEngine, now: int) -> tuple[set[tuple[int, str]], set[str]]:
        present: set[tuple[int, str]] = set()
        triggers: set[str] = set()
        if self.switch is not None:
            worst = "NotHandle"
            for ev, _t in self.switch.current.values():
                code = canonical_code(switch_code(ev.event_type, ev.fault_id, ev.peer_device))
                if code in self.relation_codes:
                    present.add((SWITCH_WIDE, code))
                lv = self.switch.table.level(code) or "NotHandle"
                if SWITCH_LEVEL_RANK[lv] > SWITCH_LEVEL_RANK[worst]:
                    worst = lv
            if SWITCH_NODE_STATUS[worst] == "UnHealthy":
                return present, triggers  # the reference skips the node's device faults
        a3 = self.a3()
        for logic, d in eng.devices.items():
            if d.health == "UnHealthy":
                continue  # the reference's CardUnhealthy chips contribute nothing
            for c in d.codes():
                name = self._chip.get(c)
                if name is None:
                    continue
                if name in self.relation_codes:
                    present.add((logic, name))
                if name in self.trigger_codes:
                    if a3 and name in CQE_TRIGGERS:
                        if not self.cqe_seen or self.cqe_seen[-1] != now:
                            self.cqe_seen.append(now)
                    else:
                        triggers.add(name)
        return present, triggers

    def _apply(self, eng: FaultEngine, w: Watched) -> set[int]:
        if w.logic == SWITCH_WIDE:
            if self.switch is not None and w.strategy is not None:
                self.switch.overrides[w.code] = SWITCH_LEVEL[w.strategy]
            return set()
        d = eng.devices.get(w.logic)
        if d is None or w.strategy is None:
            return set()
        code = parse_code(w.code)
        level = CHIP_LEVEL[w.strategy]
        cur = d.reasons.get((code, RELATION))
        if cur is not None and cur.level == level:
            return set()
        if cur is not None:
            eng.drop_reason(d, code, RELATION)
        eng.set_reason(d, UpgradeReason(code, level, RELATION, w.since_ms))
        return {w.logic}

    def _forget(self, eng: FaultEngine, key: tuple[int, str]) -> set[int]:
        w = self.watched.pop(key)
        if w.logic == SWITCH_WIDE:
            if self.switch is not None:
                self.switch.overrides.pop(w.code, None)
            return set()
        d = eng.devices.get(w.logic)
        code = parse_code(w.code)
        if d is None or (code, RELATION) not in d.reasons:
            return set()
        eng.drop_reason(d, code, RELATION)
        return {w.logic}
