"""deviced's fault sources (issue 12): each only emits into the engine (or the switch state).

``SOURCES`` is the explicit tuple, in start order and in the order their cycle hooks run:

- :class:`CardDrop` — health -8012 per chip, every cycle while subscribed (§1.1 card drop).
- :class:`ChipEvents` — DCMI fault callbacks (C thread -> token bucket -> ``ctx.from_thread``), the
  subscription (3 tries, else "fault get mode downgrade") and its polling fallback (mend, §1.1).
- :class:`LinkCheck` — hccn_tool link state of chips without network codes (the 20 s rule is a
  duration rule of the engine).
- :class:`GatewayProbe` — the gateway probe every ``--probe-interval`` s (2.5), 1 s per call.
- :class:`LingquSwitch` — lingqu switch subscription and full queries (§7).
- :class:`NvmlHealth` — NVIDIA GPU conditions polled through NVML (``--backend nvml`` only, issue 33).
"""

from deviced.sources.base import Deps, DeviceSource
from deviced.sources.chip import CardDrop, ChipEvents
from deviced.sources.lingqu import LingquSwitch
from deviced.sources.network import GatewayProbe, LinkCheck
from deviced.sources.nvml import NvmlHealth

SOURCES = (CardDrop, ChipEvents, LinkCheck, GatewayProbe, LingquSwitch, NvmlHealth)

__all__ = [
    "SOURCES",
    "CardDrop",
    "ChipEvents",
    "Deps",
    "DeviceSource",
    "GatewayProbe",
    "LingquSwitch",
    "LinkCheck",
    "NvmlHealth",
]
