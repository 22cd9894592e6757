"""The port through which :mod:`deviced.rules` sees the engine that runs them (issue 28: the rules and
the engine no longer import each other; :class:`deviced.engine.FaultEngine` satisfies it)."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

from deviced.state import Device, DeviceEvent, UpgradeReason
from faultmesh.levels import NpuLevel

if TYPE_CHECKING:
    from deviced.tables import Customization, FaultCodeTable


class RuleHost(Protocol):
    """What the rules read and call of the engine that runs them (:class:`deviced.engine.FaultEngine`
    is one): its tables, devices, counters, clock and reason API. The rules import no engine."""

    table: FaultCodeTable
    custom: Customization
    devices: dict[int, Device]
    stats: collections.Counter[str]
    levels_by_event: collections.Counter[tuple[str, str]]
    max_codes: int
    restart_grace_ms: int
    restore_until_ms: int

    def now(self) -> int: ...
    def submit(self, ev: DeviceEvent, order: float | None = None) -> bool: ...
    def base_level(self, code: int, severity: int | None) -> tuple[NpuLevel, bool]: ...
    def set_reason(self, d: Device, r: UpgradeReason) -> None: ...
    def drop_reason(self, d: Device, code: int, kind: str) -> None: ...
    def refresh(self, logic: int) -> bool: ...
    def code_level(self, d: Device, code: int) -> NpuLevel: ...
