"""faultmesh shared core: fault model, levels, tables, config, logging, HTTP, agent stream, CLI."""

__version__ = "0.1.0"
