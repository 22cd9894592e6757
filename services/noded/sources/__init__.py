"""noded's fault sources: its one extension model (issue 12, anchors §7).

``SOURCES = (Bmc, Dpc, Dtfs, Pingmesh, SlowNode)`` — started in this order by :mod:`noded.app`,
stopped in reverse. Each is a :class:`faultmesh.source.Source` (``name``, ``supported()``,
``async start(ctx)``, ``async stop()``) and, for noded's wiring, also has:

- ``add_arguments(parser)`` (static): its command-line flags (Dpc and Dtfs share one set); the
  flag names are the CLI's and the chart's;
- ``Config``: its typed configuration section (a frozen dataclass of :mod:`noded.sections` whose
  fields are the flags its ``add_arguments`` adds);
- ``from_config(section, metrics)`` (class method): the instance for its section (built once by
  :func:`config_section`) and noded's :class:`noded.metrics.NodedMetrics`. Raises ``ValueError`` /
  ``OSError`` for a configuration noded cannot run with (exit status 2).

A source sees only its :class:`faultmesh.source.SourceContext`: its section (``ctx.config``), the
agent state scoped to it, ``spawn``, ``run_blocking``, ``add_route``, ``on_control`` for the
ControlMessage body kinds it handles, and the metrics registry.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from faultmesh import config
from noded.pingmesh import Pingmesh
from noded.slownode import SlowNode
from noded.sources.bmc import Bmc
from noded.sources.storage import Dpc, Dtfs

SOURCES: tuple[type, ...] = (Bmc, Dpc, Dtfs, Pingmesh, SlowNode)

__all__ = ["SOURCES", "Bmc", "Dpc", "Dtfs", "Pingmesh", "SlowNode", "add_arguments", "config_section"]


def _flag_adders(sources: Iterable[type]) -> list[Callable[[argparse.ArgumentParser], None]]:
    """The distinct ``add_arguments`` functions of ``sources``, in order (subclasses share one)."""
    out: list[Callable] = []
    for cls in sources:
        fn = cls.add_arguments
        if fn not in out:
            out.append(fn)
    return out


def add_arguments(parser: argparse.ArgumentParser, sources: Iterable[type] = SOURCES) -> None:
    """Add every source's flags to ``parser`` (each set once)."""
    for fn in _flag_adders(sources):
        fn(parser)


def config_section(args: argparse.Namespace, cls: type) -> Any:
    """The source's own section: its typed ``cls.Config`` (:mod:`noded.sections`), built from the
    parsed ``args`` by :func:`faultmesh.config.section`; its fields are the flags
    ``cls.add_arguments`` defines. Raises ``ConfigError`` when ``args`` lacks one."""
    return config.section(cls.Config, args)
