"""What deviced's sources share: their dependencies and the per-cycle hook (issue 12).

A deviced source is a :class:`faultmesh.source.Source` (``PushSource`` or ``PolledSource``) that only
EMITS into the engine (events, poll results, probe / link / card-drop signals) or, for the switch,
into the :class:`deviced.switch.SwitchState`; it never builds faults and never touches the agent
stream. Besides its own tasks (started by ``start(ctx)``), each source may take part in the cycle
through :meth:`DeviceSource.on_cycle`, run in ``SOURCES`` order before the engine's cycle.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from deviced.chipio import ChipIO
from deviced.engine import FaultEngine
from deviced.switch import SwitchState


@dataclass
class Deps:
    """The shared parts a deviced source is built with: ``engine`` (the device state), ``io`` (the
    backend calls and chip ids), ``switch`` (the switch state), ``args`` (the flags: each source reads
    its own), ``wake()`` (ask for a cycle soon; loop thread only), ``wake_urgent()`` (the same, and
    report a new fault at once: :meth:`deviced.cycle.Cycle.wake_urgent`)."""

    engine: FaultEngine
    io: ChipIO
    switch: SwitchState
    args: argparse.Namespace
    wake: Callable[[], None]
    wake_urgent: Callable[[], None]


class DeviceSource(Protocol):
    """What deviced's wiring reads of a source besides :class:`faultmesh.source.Source`: its
    ``fault_sources`` (``()``: the engine's sink reports and readies dcmi / lingqu, not the source)
    and its per-cycle hook ``on_cycle()``, run inside the cycle before ``engine.cycle()``; it must
    not raise for a failed backend call (count it and skip the chip). A source gets its
    :class:`Deps` in its constructor; it subclasses only ``PushSource`` or ``PolledSource``."""

    name: str
    fault_sources: tuple[str, ...] | None

    async def on_cycle(self) -> None: ...
