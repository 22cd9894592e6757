"""Fault levels and their precedence, and the cluster health mapping.

Source: ../shared/spec/design.md "Fault model"; reference deviced.md §3.1 (NPU levels),
noded.md §2 (node levels), clusterd.md §2.4 (Healthy / SubHealthy / UnHealthy mapping).
"""

from __future__ import annotations

from enum import IntEnum


class NpuLevel(IntEnum):
    """NPU fault levels in the reference's precedence (higher value = more severe)."""

    NotHandleFault = 0
    SubHealthFault = 1
    RestartRequest = 2
    RestartBusiness = 3
    FreeRestartNPU = 4
    RestartNPU = 5
    PreSeparateNPU = 6
    SeparateNPU = 7
    ManuallySeparateNPU = 8

    @classmethod
    def parse(cls, name: str) -> NpuLevel:
        """Return the level named ``name`` (exact reference spelling). Raises ``ValueError``."""
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"unknown NPU fault level {name!r}") from None


class NodeLevel(IntEnum):
    """NodeD fault levels (reference noded.md §2), higher = more severe."""

    NotHandleFault = 0
    PreSeparateFault = 1
    SeparateFault = 2

    @classmethod
    def parse(cls, name: str) -> NodeLevel:
        """Return the level named ``name``. Raises ``ValueError``."""
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"unknown node fault level {name!r}") from None


NODE_STATUS_BY_LEVEL = {
    NodeLevel.NotHandleFault: "Healthy",
    NodeLevel.PreSeparateFault: "PreSeparate",
    NodeLevel.SeparateFault: "UnHealthy",
}

HEALTHY = "Healthy"
SUB_HEALTHY = "SubHealthy"
UNHEALTHY = "UnHealthy"

_HEALTH_RANK = {HEALTHY: 0, SUB_HEALTHY: 1, UNHEALTHY: 2}

# clusterd.md §2.4: level name -> cluster health. Names not listed map to UnHealthy only if they are
# known separation/restart levels; unknown names are treated as Healthy by the reference, which hides
# faults, so faultmesh treats an unknown level as SubHealthy (visible, not isolating).
_LEVEL_HEALTH = {
    "NotHandleFault": HEALTHY,
    "NotHandle": HEALTHY,
    "SubHealthFault": SUB_HEALTHY,
    "PreSeparateFault": SUB_HEALTHY,
    "PreSeparate": SUB_HEALTHY,
    "SubHealth": SUB_HEALTHY,
    "PreSeparateNPU": SUB_HEALTHY,
    "RestartRequest": UNHEALTHY,
    "RestartBusiness": UNHEALTHY,
    "RestartNPU": UNHEALTHY,
    "FreeRestartNPU": UNHEALTHY,
    "SeparateNPU": UNHEALTHY,
    "ManuallySeparateNPU": UNHEALTHY,
    "SeparateFault": UNHEALTHY,
    "Separate": UNHEALTHY,
}


KNOWN_LEVELS = frozenset(
    set(NpuLevel.__members__)
    | set(NodeLevel.__members__)
    | set(_LEVEL_HEALTH)
    | {"NormalNPU", "NormalNetwork"}
)
"""Every fault level name a faultmesh agent may report (NPU, node and switch levels)."""


def level_health(level: str) -> str:
    """Map a fault level name to Healthy / SubHealthy / UnHealthy (clusterd.md §2.4)."""
    return _LEVEL_HEALTH.get(level, SUB_HEALTHY)


def worst_health(healths) -> str:
    """Return the most severe of an iterable of health strings (Healthy when empty)."""
    worst = HEALTHY
    for h in healths:
        if _HEALTH_RANK.get(h, 0) > _HEALTH_RANK[worst]:
            worst = h
    return worst


def level_severity(level: str) -> int:
    """A total order over every level name, NPU and node levels together, for "worst level" choices.

    NPU levels keep their precedence; node levels map onto it (PreSeparateFault ~ PreSeparateNPU,
    SeparateFault ~ SeparateNPU). Unknown names sort just above NotHandleFault. One dict lookup (a
    scrape of 16k nodes x 10 faults asks 160k times after a restart, issue 18).
    """
    return _SEVERITY.get(level, 5)


_SEVERITY: dict[str, int] = {
    "PreSeparateFault": int(NpuLevel.PreSeparateNPU) * 10,
    "PreSeparate": int(NpuLevel.PreSeparateNPU) * 10,
    "SeparateFault": int(NpuLevel.SeparateNPU) * 10,
    "Separate": int(NpuLevel.SeparateNPU) * 10,
    "SubHealth": int(NpuLevel.SubHealthFault) * 10,
    "NotHandle": 0,
    **{name: int(member) * 10 for name, member in NpuLevel.__members__.items()},  # NPU names win
}
