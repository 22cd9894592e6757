"""Parsers for the reference's cross-fault rule tables: ``faultDuration.json`` and
``relationFaultCustomization.json`` (reference clusterd.md §6.3; file list in deviced.md §9).

Both tables name a fault either by a chip code (hex, ``"81078603"``) or by a switch code string
(``"[0x08520003,na,L2,na]"``, deviced.md §7). :func:`canonical_code` gives the one spelling used for
lookups: chip codes upper-case hex without ``0x``; switch codes lower-case hex alarm id, ``L2``
upper-case, an empty fault id read as ``na`` (the repository's older relation file spells the L2
link-down ``[0x08520003,,L2,na]``, the current one ``[0x08520003,na,L2,na]``).

Validation follows the rest of faultmesh's tables: a file whose top level has the wrong shape raises
:class:`RuleTableError`; a bad entry is dropped with its reason in ``rejected`` (and logged) while
the valid ones apply. These are pure parsers (no file watching, no rule engine); deviced loads the
shipped defaults through ``deviced.tables`` and the CLI through :mod:`faultmesh.faultinfo`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from faultmesh.log import event

log = logging.getLogger("faultmesh.faultrules")


def unknown_key(obj: dict, known, where: str) -> str:
    """The refusal of a fault table holding a key outside ``known`` ("" when none): a misspelt level
    name (``SeperateNPUCodes``) would silently drop its codes, so deviced's, noded's and clusterd's
    tables refuse the whole file (docs/fault-tables.md); the caller raises its own error with it."""
    unknown = sorted(set(obj) - set(known))
    if not unknown:
        return ""
    return f"{where}: unknown key {unknown[0][:80]!r} (known: {', '.join(known)})"


_CHIP_RE = re.compile(r"^(?:0x)?[0-9a-f]{1,16}$", re.IGNORECASE)
_SWITCH_RE = re.compile(r"^\[0x[0-9a-f]{8},(\d+|na|),(cpu|npu|l2|na),na\]$", re.IGNORECASE)
DURATION_TYPES = ("faultDevice", "faultSwitch")
RELATION_STRATEGIES = ("SubHealth", "Separate")
MAX_INTERVAL_S = 2**31 - 1


class RuleTableError(ValueError):
    """A rule table whose top level is unusable (the message names the table and why)."""


def canonical_code(text: Any) -> str:
    """One spelling of a chip or switch fault code (see module doc). Raises ``ValueError``.

    ``"0x80e18008"`` -> ``"80E18008"``; ``"[0x08520003,,l2,NA]"`` -> ``"[0x08520003,na,L2,na]"``.
    """
    if not isinstance(text, str) or len(text) > 64:
        raise ValueError(f"not a fault code: {text!r}")
    s = text.strip()
    m = _SWITCH_RE.match(s)
    if m:
        alarm = s[1:11].lower()
        fid = m.group(1).lower() or "na"
        peer = m.group(2).lower()
        return f"[{alarm},{fid},{'L2' if peer == 'l2' else peer},na]"
    if _CHIP_RE.match(s):
        return s.upper().removeprefix("0X")
    raise ValueError(f"not a chip or switch fault code: {text!r}")


def is_switch_code(code: str) -> bool:
    """True for a switch code string (``[0x...,...]``), False for a chip hex code."""
    return code.startswith("[")


@dataclass(frozen=True)
class DurationTimeout:
    """One ``faultDuration.json`` entry: how long (``timeout_s``, s, ≥ 0) clusterd keeps the fault
    ``code`` waiting for a relation trigger; ``fault_type`` is faultDevice or faultSwitch
    (informational, clusterd.md §6.3)."""

    code: str
    fault_type: str
    timeout_s: int


@dataclass(frozen=True)
class RelationRule:
    """One ``relationFaultCustomization.json`` rule: when ``trigger`` and every code of
    ``relations`` are present (same job), the devices carrying the relation codes get ``strategy``
    (SubHealth or Separate; clusterd.md §6.3)."""

    trigger: str
    relations: tuple[str, ...]
    strategy: str


def _reject(rejected: list[str], name: str, why: str) -> None:
    """Keep ``why`` in a table's ``rejected`` list and log it (one line per dropped entry)."""
    rejected.append(why)
    event(log, logging.WARNING, "fault rule dropped", table=name, reason=why)


@dataclass
class DurationTable:
    """``faultDuration.json``: canonical code -> :class:`DurationTimeout` (first valid entry wins).
    A code with no entry has a 0 s deadline (clusterd.md §6.3): see :meth:`timeout_s`. ``rejected``
    holds the reason of each dropped entry."""

    rejected: list[str] = field(default_factory=list)
    timeouts: dict[str, DurationTimeout] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: Any, name: str = "faultDuration.json") -> DurationTable:
        """Validate a parsed file (a JSON list). Raises :class:`RuleTableError` for a non-list."""
        if not isinstance(obj, list):
            raise RuleTableError(f"{name}: top level must be a list")
        out = cls()
        for i, r in enumerate(obj):
            where = f"[{i}]"
            if not isinstance(r, dict):
                _reject(out.rejected, name, f"{where}: not an object")
                continue
            try:
                code = canonical_code(r.get("FaultCode"))
            except ValueError as e:
                _reject(out.rejected, name, f"{where}.FaultCode: {e}")
                continue
            ftype = r.get("FaultType") or ("faultSwitch" if is_switch_code(code) else "faultDevice")
            if ftype not in DURATION_TYPES:
                _reject(
                    out.rejected,
                    name,
                    f"{where}.FaultType {r.get('FaultType')!r} not one of {DURATION_TYPES}",
                )
                continue
            t = r.get("TimeOutInterval")
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_INTERVAL_S:
                _reject(out.rejected, name, f"{where}.TimeOutInterval {t!r} must be an integer ≥ 0 (seconds)")
                continue
            if code in out.timeouts:
                _reject(out.rejected, name, f"{where}: duplicate FaultCode {code}")
                continue
            out.timeouts[code] = DurationTimeout(code, ftype, t)
        return out

    def timeout_s(self, code: str) -> int:
        """The deadline of ``code`` (any spelling) in seconds; 0 when it has no entry."""
        try:
            entry = self.timeouts.get(canonical_code(code))
        except ValueError:
            return 0
        return entry.timeout_s if entry else 0


@dataclass
class RelationTable:
    """``relationFaultCustomization.json``: the list of :class:`RelationRule` in file order;
    ``rejected`` holds the reason of each dropped entry."""

    rejected: list[str] = field(default_factory=list)
    rules: list[RelationRule] = field(default_factory=list)

    @classmethod
    def from_obj(cls, obj: Any, name: str = "relationFaultCustomization.json") -> RelationTable:
        """Validate a parsed file (a JSON list). The strategy is read from ``FaultStrategy`` (the
        shipped reference file) or ``DeviceStrategy`` (the repository's older spelling). Raises
        :class:`RuleTableError` for a non-list."""
        if not isinstance(obj, list):
            raise RuleTableError(f"{name}: top level must be a list")
        out = cls()
        seen: set[RelationRule] = set()
        for i, r in enumerate(obj):
            where = f"[{i}]"
            if not isinstance(r, dict):
                _reject(out.rejected, name, f"{where}: not an object")
                continue
            try:
                trigger = canonical_code(r.get("TriggerFault"))
            except ValueError as e:
                _reject(out.rejected, name, f"{where}.TriggerFault: {e}")
                continue
            if is_switch_code(trigger):
                _reject(out.rejected, name, f"{where}.TriggerFault {trigger} must be a chip code")
                continue
            rel = r.get("RelationFaults")
            if not isinstance(rel, list) or not rel:
                _reject(out.rejected, name, f"{where}.RelationFaults must be a non-empty list")
                continue
            try:
                relations = tuple(dict.fromkeys(canonical_code(c) for c in rel))
            except ValueError as e:
                _reject(out.rejected, name, f"{where}.RelationFaults: {e}")
                continue
            strategy = r.get("FaultStrategy", r.get("DeviceStrategy"))
            if strategy not in RELATION_STRATEGIES:
                _reject(
                    out.rejected, name, f"{where}.FaultStrategy {strategy!r} not one of {RELATION_STRATEGIES}"
                )
                continue
            rule = RelationRule(trigger, relations, strategy)
            if rule in seen:
                _reject(out.rejected, name, f"{where}: duplicate rule")
                continue
            seen.add(rule)
            out.rules.append(rule)
        return out

    def involving(self, code: str) -> list[RelationRule]:
        """The rules where ``code`` (any spelling) is the trigger or one of the relation faults."""
        try:
            c = canonical_code(code)
        except ValueError:
            return []
        return [r for r in self.rules if r.trigger == c or c in r.relations]
