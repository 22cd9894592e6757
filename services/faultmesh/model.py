"""The fault record shared by every faultmesh service (design.md "Fault model").

A ``Fault`` is keyed by ``FaultKey(node, device_type, device_id, code, source)``; times are ms since
the epoch. Conversion to and from protobuf lives in :mod:`faultmesh.wire`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NamedTuple


class Assertion(StrEnum):
    """What a fault report asserts (reference ``Assertion``): ``occur`` (active), ``recover`` (gone),
    ``once`` (a one-shot event, active until it expires). Values are the wire strings."""

    OCCUR = "occur"
    RECOVER = "recover"
    ONCE = "once"


OCCUR = Assertion.OCCUR
RECOVER = Assertion.RECOVER
ONCE = Assertion.ONCE
ASSERTIONS = tuple(Assertion)


class ChangeKind(StrEnum):
    """What one committed change did to the fault center: ``occur`` (a new key), ``update`` (same key,
    new level or attributes) or ``recover`` (the key removed)."""

    OCCUR = "occur"
    UPDATE = "update"
    RECOVER = "recover"


NODE_DEVICE_ID = -1


def now_ms() -> int:
    """Wall-clock time in ms since the epoch."""
    return time.time_ns() // 1_000_000


class FaultKey(NamedTuple):
    """Identity of a fault in the fault center: (node, device_type, device_id, code, source)."""

    node: str
    device_type: str
    device_id: int
    code: str
    source: str


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault record.

    Fields: ``source`` (which detector), ``node``, ``device_type`` (NPU, Node, CPU, Switch, ...),
    ``device_id`` (-1 for the node), ``code`` (8 upper-case hex digits or a 9-digit public code),
    ``level`` (reference level name), ``assertion`` (occur / recover / once), ``first_seen_ms`` and
    ``last_seen_ms`` (ms since the epoch), ``attributes`` (free string map: unknown=true,
    influence ranks, description, ...).
    """

    source: str
    node: str
    device_type: str
    device_id: int
    code: str
    level: str
    assertion: str = OCCUR
    first_seen_ms: int = 0
    last_seen_ms: int = 0
    attributes: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> FaultKey:
        """The fault center key of this record."""
        return FaultKey(self.node, self.device_type, self.device_id, self.code, self.source)

    def with_times(self, first_seen_ms: int, last_seen_ms: int) -> Fault:
        """A copy with the given first/last-seen times (ms)."""
        return replace(self, first_seen_ms=first_seen_ms, last_seen_ms=last_seen_ms)

    def same_content(self, other: Fault) -> bool:
        """True when level, assertion and attributes are equal (times ignored)."""
        return (
            self.level == other.level
            and self.assertion == other.assertion
            and self.attributes == other.attributes
        )


class Change(NamedTuple):
    """One committed change: ``kind`` (:class:`ChangeKind`) and the fault (for ``recover``, the
    record as it was before removal). The one meaning of occur/update/recover in every service."""

    kind: ChangeKind
    fault: Fault
