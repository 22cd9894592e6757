"""Relation faults per job: a trigger fault on one node of a job and the relation faults on another
node of the same job are paired here (issue 32 item 5).

Source: the reference ClusterD's ``relation_fault_processor.go`` (``relationfault`` package) with the
tables ``relationFaultCustomization.json`` (trigger + relation codes -> SubHealth / Separate) and
``faultDuration.json`` (per relation code, how long it waits for a trigger, s). For every job, over the
devices the job holds (its ranks' NPUs) and the switch of each of its nodes:

- a chip fault whose code is a relation code is watched from the cycle it is first seen, for its
  deadline; a trigger code anywhere in the job is a trigger (on an A3 job — some rank in a super pod —
  the CQE triggers 8C1F8608 / 4C1F8608 are not: the reference's ``IsCqeFault``);
- a chip whose health is UnHealthy contributes nothing (the reference's ``CardUnhealthy``), and a
  node whose switch fault is at level Separate contributes no chip fault;
- a rule whose trigger is present in the job and all of whose relation codes are present in the job
  fires while a relation fault still waits: each such relation fault gets the rule's strategy
  (Separate dominates SubHealth) and keeps it until it leaves.

Kept on purpose, and why: deviced still applies the same tables per node (:mod:`deviced.relations`),
so a node without a job, or without clusterd, is covered and the level travels in the agent's own
report. This module therefore acts only where deviced cannot: a rule that holds in the job but not on
the relation fault's own node (the trigger or some relation code is on another node of the job);
the timeout defaults (switch -> SubHealth, chip CQE settlement) stay deviced's.

Outcome: for each relation fault given a strategy here, a fault of source ``relation`` on the same
node / device / code at level ``SeparateNPU`` / ``SubHealthFault`` (a Switch fault: ``Separate`` /
``SubHealthFault``), attributes ``job``, ``trigger``, ``strategy`` — the reference patches the pods'
``fault-type`` label instead; faultmesh's brain and Kubernetes publisher read levels from the fault
center. The outcome faults leave when their relation fault does or the job ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from faultmesh.faultrules import DurationTable, RelationTable, canonical_code
from faultmesh.jobspec import Job
from faultmesh.log import event
from faultmesh.model import Fault, FaultKey, now_ms
from faultmesh.runtime import wait_for

log = logging.getLogger("clusterd.relations")

SOURCE = "relation"
SEPARATE, SUBHEALTH = "Separate", "SubHealth"
CHIP_LEVEL = {SEPARATE: "SeparateNPU", SUBHEALTH: "SubHealthFault"}
SWITCH_LEVEL = {SEPARATE: "Separate", SUBHEALTH: "SubHealthFault"}
CQE_TRIGGERS = frozenset({"8C1F8608", "4C1F8608"})
SWITCH = "Switch"
MAX_WAIT_S = 5.0  # the loop re-evaluates at least this often (deadlines pass without a fault change)
MIN_INTERVAL_S = 0.2  # a burst of fault batches is evaluated once


@dataclass
class Watched:
    """One relation fault of one job: ``since_ms`` (first seen), ``deadline_ms``, ``strategy`` (None,
    SubHealth, Separate) and the ``trigger`` code that gave it."""

    since_ms: int
    deadline_ms: int
    strategy: str | None = None
    trigger: str = ""


def _stronger(a: str | None, b: str) -> str:
    return SEPARATE if SEPARATE in (a, b) else b


class JobRelations:
    """Per-job relation evaluation (module doc). ``jobs()``: the job registry's jobs; ``health(node,
    device_id)``: a chip's health (``""`` unknown); ``submit(node, faults)``: make ``faults`` every
    ``relation`` fault of ``node`` (the fault center's ``replace_source``). :meth:`evaluate` is one
    pure cycle; :meth:`run` loops on :meth:`mark`."""

    def __init__(
        self,
        relations: RelationTable,
        durations: DurationTable,
        jobs: Callable[[], Iterable[Job]],
        health: Callable[[str, int], str] = lambda node, dev: "",
    ) -> None:
        self.jobs = jobs
        self.health = health
        self.set_tables(relations, durations)
        self.watched: dict[tuple[str, FaultKey], Watched] = {}  # (job id, relation fault key) -> state
        self.outcome: dict[str, dict[FaultKey, Fault]] = {}  # node -> relation faults last submitted
        self._dirty = asyncio.Event()

    def set_tables(self, relations: RelationTable, durations: DurationTable) -> None:
        """Use these tables (the watched faults start over)."""
        self.relations, self.durations = relations, durations
        self.relation_codes = {canonical_code(c) for r in relations.rules for c in r.relations}
        self.trigger_codes = {canonical_code(r.trigger) for r in relations.rules}
        self.watched = {}

    def mark(self, *_: object) -> None:
        """Something changed (faults, jobs): evaluate soon."""
        self._dirty.set()

    # -- one cycle ---------------------------------------------------------------------------------
    def _job_faults(self, job: Job, by_node: dict[str, list[Fault]]) -> list[Fault]:
        """The faults the job sees: its NPUs' (not UnHealthy ones) and its nodes' switch faults; a
        node whose switch is at Separate gives only its switch faults."""
        held = {(r.node, r.device_id) for r in job.ranks}
        out: list[Fault] = []
        for node in job.nodes():
            faults = by_node.get(node, ())
            switch = [f for f in faults if f.device_type == SWITCH]
            out += switch
            if any(f.level == SWITCH_LEVEL[SEPARATE] for f in switch):
                continue
            out += [
                f for f in faults
                if f.device_type != SWITCH and (node, f.device_id) in held
                and self.health(node, f.device_id) != "UnHealthy"
            ]  # fmt: skip
        return out

    def evaluate(self, faults: Iterable[Fault], now_ms: int) -> dict[str, dict[FaultKey, Fault]]:
        """One cycle over the fault center's ``faults``: node -> the ``relation`` faults it should
        carry now (module doc)."""
        by_node: dict[str, list[Fault]] = defaultdict(list)
        for f in faults:
            if f.source != SOURCE and f.assertion != "recover":
                by_node[f.node].append(f)
        seen: set[tuple[str, FaultKey]] = set()
        out: dict[str, dict[FaultKey, Fault]] = defaultdict(dict)
        for job in self.jobs():
            a3 = any(r.super_pod_id >= 0 for r in job.ranks)
            mine = self._job_faults(job, by_node)
            rel = [(f, canonical_code(f.code)) for f in mine if canonical_code(f.code) in self.relation_codes]
            trig: dict[str, set[str]] = defaultdict(set)  # trigger code -> nodes
            for f in mine:
                c = canonical_code(f.code)
                if c in self.trigger_codes and not (a3 and c in CQE_TRIGGERS):
                    trig[c].add(f.node)
            codes_at: dict[str, set[str]] = defaultdict(set)  # relation code -> nodes
            for f, c in rel:
                codes_at[c].add(f.node)
            for f, c in rel:
                k = (job.id, f.key)
                seen.add(k)
                w = self.watched.get(k)
                if w is None:
                    w = self.watched[k] = Watched(now_ms, self.durations.timeout_s(c) * 1000)
                if w.strategy != SEPARATE and now_ms - w.since_ms < w.deadline_ms:
                    self._match(job, f, c, w, trig, codes_at)
                if w.strategy is not None:
                    lv = (SWITCH_LEVEL if f.device_type == SWITCH else CHIP_LEVEL)[w.strategy]
                    o = Fault(SOURCE, f.node, f.device_type, f.device_id, f.code, lv, first_seen_ms=w.since_ms,
                              last_seen_ms=w.since_ms,
                              attributes={"job": job.id, "trigger": w.trigger, "strategy": w.strategy})  # fmt: skip
                    prev = out[f.node].get(o.key)
                    if prev is None or (prev.level != o.level and w.strategy == SEPARATE):
                        out[f.node][o.key] = o
        for k in set(self.watched) - seen:
            del self.watched[k]
        return dict(out)

    def _match(self, job: Job, f: Fault, code: str, w: Watched, trig, codes_at) -> None:
        """Give ``w`` the strongest strategy of the rules that hold in the job but not on ``f``'s node."""
        for rule in self.relations.rules:
            t = canonical_code(rule.trigger)
            need = [canonical_code(c) for c in rule.relations]
            if code not in need or t not in trig or not all(c in codes_at for c in need):
                continue
            if f.node in trig[t] and all(f.node in codes_at[c] for c in need):
                continue  # the rule holds on the node itself: deviced's per-node stage decides it
            new = _stronger(w.strategy, rule.strategy)
            if new != w.strategy:
                w.strategy, w.trigger = new, t
                event(log, logging.WARNING, "relation fault matched across the job", job=job.id, node=f.node,
                      device=f.device_id, code=code, trigger=t, strategy=new)  # fmt: skip

    # -- the loop ----------------------------------------------------------------------------------
    def seed(self, faults: Iterable[Fault]) -> None:
        """Take the ``relation`` faults the fault center restored (a restart) as the last submitted,
        so the first cycle removes the ones no longer due."""
        self.outcome = {}
        for f in faults:
            if f.source == SOURCE:
                self.outcome.setdefault(f.node, {})[f.key] = f

    async def sync(self, faults: Iterable[Fault], now_ms: int, submit) -> int:
        """Evaluate and submit every node whose relation faults changed. Returns how many nodes."""
        want = self.evaluate(faults, now_ms)
        n = 0
        for node in sorted(set(want) | set(self.outcome)):
            new = want.get(node, {})
            if new != self.outcome.get(node, {}):  # Fault equality covers the level
                await submit(node, list(new.values()))
                n += 1
            if new:
                self.outcome[node] = new
            else:
                self.outcome.pop(node, None)
        return n

    async def run(self, faults: Callable[[], Iterable[Fault]], submit, clock: Callable[[], int]) -> None:
        """Until cancelled: on :meth:`mark` (or every ``MAX_WAIT_S``: deadlines pass), :meth:`sync`."""
        while True:
            try:
                await wait_for(self._dirty.wait(), MAX_WAIT_S)
            except TimeoutError:
                pass
            self._dirty.clear()
            try:
                await self.sync(faults(), clock(), submit)
            except Exception as e:  # a store error: the next cycle submits again
                event(log, logging.WARNING, "relation faults not submitted", error=str(e))
                self.outcome.clear()
                self._dirty.set()
                await asyncio.sleep(1.0)
            await asyncio.sleep(MIN_INTERVAL_S)


def _table(path: str, default_name: str) -> Any:
    """A table file's JSON; ``""``: faultmesh's default (the copy deviced ships, read as data)."""
    if path:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    return json.loads((resources.files("deviced") / "data" / default_name).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class RelationConfig:
    """The per-job relation rules' configuration section (:func:`faultmesh.config.section`):
    ``relation_rules`` ``--relation-rules`` (a relationFaultCustomization.json, "" faultmesh's,
    ``off``), ``relation_durations`` ``--relation-durations`` (a faultDuration.json, "" faultmesh's)."""

    relation_rules: str
    relation_durations: str


class RelationComponent:
    """clusterd's per-job relation rules (module doc) as a component: ``--relation-rules`` /
    ``--relation-durations`` (``off``: not run); ``jobs()``: the job registry's jobs (public read API,
    given by clusterd.app). Subscribes to the fault center and submits ``relation`` faults."""

    name = "relations"

    @staticmethod
    def add_arguments(parser) -> None:
        g = parser.add_argument_group("relation faults per job")
        g.add_argument(
            "--relation-rules", default="",
            help="relationFaultCustomization.json (default: faultmesh's; 'off': no per-job relation rules)",
        )  # fmt: skip
        g.add_argument("--relation-durations", default="", help="faultDuration.json (default: faultmesh's)")

    def __init__(self, ctx: Any, cfg: RelationConfig, jobs: Callable[[], Iterable[Job]]) -> None:
        self.ctx = ctx
        self.rules: JobRelations | None = None
        if cfg.relation_rules == "off":
            return
        try:
            rel = RelationTable.from_obj(_table(cfg.relation_rules, "relationFaultCustomization.json"))
            dur = DurationTable.from_obj(_table(cfg.relation_durations, "faultDuration.json"))
        except (OSError, ValueError, ModuleNotFoundError) as e:  # RuleTableError is a ValueError
            raise OSError(f"relation tables: {e}") from e  # clusterd's start path: exit 1 with the reason
        self.rules = JobRelations(rel, dur, jobs, self._health)
        ctx.center.subscribe(
            "relations", lambda changes: self._changed(changes), resync=lambda faults: self.rules.mark()
        )

    def _changed(self, changes) -> None:
        if self.rules is not None and any(c.fault.source != SOURCE for c in changes):
            self.rules.mark()  # its own submissions alone change nothing

    def _health(self, node: str, device_id: int) -> str:
        """A chip's health from the agents' device views: faults name the physical id (deviced's
        ``Fault.device_id``), the views are keyed by logic id and carry ``phy_id``."""
        st = self.ctx.nodes.get(node)
        for d in st.devices.values() if st else ():
            if d.get("phy_id", d.get("device_id")) == device_id and d.get("health"):
                return str(d["health"])
        return ""

    async def _submit(self, node: str, faults: list[Fault]) -> None:
        await self.ctx.center.replace_source(node, SOURCE, faults)

    async def start(self) -> None:
        """Start the loop (owned by clusterd's task owner)."""
        if self.rules is not None:
            self.rules.seed(self.ctx.center.faults())  # restored with the center before components start
            self.rules.mark()
            self.ctx.tasks.spawn(
                self.rules.run(self.ctx.center.faults, self._submit, now_ms), name="relations"
            )

    async def stop(self) -> None:
        """Nothing to flush: the outcome lives in the fault center."""
