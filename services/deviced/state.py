"""deviced's device-state records: one fault event in, and what the engine keeps per chip.

These are the engine's data (reference deviced.md §1.1, §4.2, §4.3). Only :mod:`deviced.engine` and
its rules (:mod:`deviced.rules`) change them; everything else reads them through the engine
(``engine.devices``) and writes through the engine's public methods.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from faultmesh.dcmi.api import DeviceIds
from faultmesh.levels import NpuLevel

RECOVER, OCCUR, ONCE = 0, 1, 2
ASSERTION_NAMES = {RECOVER: "recover", OCCUR: "occur", ONCE: "once"}

FREQUENCY = "FaultFrequency"
DURATION = "FaultDuration"
MAX_CODES_PER_DEVICE = 512  # active codes kept per chip (the driver lists at most 128)
HOT_RESET_FAILED = "HotResetFailed"  # upgrade-reason kind of a failed or refused reset (-> SeparateNPU)


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One fault event for a chip: ``logic`` id, ``code``, ``assertion`` (0 recover, 1 occur, 2 once),
    ``severity`` (0..3; None unknown), ``time_ms`` (host time, ms), ``origin`` (callback, poll, probe,
    card-drop, link)."""

    logic: int
    code: int
    assertion: int
    severity: int | None
    time_ms: int
    origin: str = "callback"


@dataclass
class CodeState:
    """An active code on a chip: first-seen time (ms), last severity, ``once`` (lives one cycle),
    ``dup_ms`` (the latest duplicate occur's time, ms; 0: none), ``restored`` (active when the state
    file was written and not seen again since the restart: see :func:`deviced.rules.restore_code`)."""

    first_seen_ms: int
    severity: int | None
    once: bool = False
    dup_ms: int = 0  # the latest duplicate occur (not a new occurrence), 0: none
    restored: bool = False


@dataclass
class DurationState:
    """§4.3 state per (code, chip): timed out or not, the event queue, and the alarm time (ms)."""

    timed_out: bool = False
    queue: list[tuple[int, int]] = field(default_factory=list)  # (time_ms, assertion)
    alarm_ms: int = 0


@dataclass
class FrequencyState:
    """§4.2 state per (code, chip): occurrence times (ms), last fault and last recover times."""

    times: list[int] = field(default_factory=list)
    last_fault_ms: int = 0
    last_recover_ms: int = 0


@dataclass
class UpgradeReason:
    """An escalation kept for a chip: ``code``, ``level``, ``kind`` (FaultFrequency / FaultDuration /
    HotResetFailed), ``time_ms``; ``occurrences``: the occurrence times (ms) a frequency rule counted
    when it fired (why the chip was raised, issue 31; not kept in the state file)."""

    code: int
    level: NpuLevel
    kind: str
    time_ms: int
    occurrences: tuple[int, ...] = ()


@dataclass
class Device:
    """Everything deviced knows about one chip, keyed by logic id. Written only by the engine.

    ``card_dropped`` (health -8012 seen), ``probe_bad`` (gateway probe abnormal), ``link_raised``
    (a link down found by hccn_tool, not in the driver's list) are the synthetic signals the sources
    feed; ``resetting`` is set while a hot reset runs. Codes active when the state file was written
    come back in ``chip`` / ``network`` marked ``restored`` (see :func:`deviced.rules.import_state`).
    """

    ids: DeviceIds
    chip: dict[int, CodeState] = field(default_factory=dict)
    network: dict[int, CodeState] = field(default_factory=dict)
    duration: dict[int, DurationState] = field(default_factory=dict)
    frequency: dict[int, FrequencyState] = field(default_factory=dict)
    reasons: dict[tuple[int, str], UpgradeReason] = field(default_factory=dict)
    manually_separated: bool = False
    reinit: bool = True  # first cycle after start mends by polling
    card_dropped: bool = False
    probe_bad: bool = False
    link_raised: bool = False
    alarm_ms: int = 0
    in_use: bool = False
    level: NpuLevel | None = None
    network_level: NpuLevel | None = None
    health: str = "Healthy"
    network_health: str = "Healthy"
    resetting: bool = False
    hbm_times: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=64))
    last_event_ms: dict[int, tuple[int, float, int]] = field(
        default_factory=dict
    )  # code -> (time, seq) last applied

    def codes(self) -> dict[int, CodeState]:
        """Chip and network codes together."""
        return {**self.chip, **self.network}

    def worst_level(self) -> NpuLevel | None:
        """The worse of the chip and network levels (None: no fault)."""
        levels = [x for x in (self.level, self.network_level) if x is not None]
        return max(levels) if levels else None

    def end_cycle(self, max_event_memory: int) -> bool:
        """End of an engine cycle: the once codes leave (True when one did), and past
        ``max_event_memory`` last-event entries those of inactive codes are forgotten (bounded memory
        under a flood of distinct codes)."""
        gone = False
        for store in (self.chip, self.network):
            for c in [c for c, s in store.items() if s.once]:
                del store[c]
                gone = True
        if len(self.last_event_ms) > max_event_memory:
            live = self.codes()
            self.last_event_ms = {c: o for c, o in self.last_event_ms.items() if c in live}
        return gone
