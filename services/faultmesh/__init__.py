"""faultmesh shared core: fault model, levels, tables, config, logging, HTTP, agent stream.

The tools (CLI, demo, simulators, trainsim) live in :mod:`fmtools`, which the core never imports."""

__version__ = "0.1.0"
