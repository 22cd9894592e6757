"""noded pingmesh (reference noded.md §6): :class:`PingmeshComponent` and its result files."""

from noded.pingmesh.component import PingmeshComponent

__all__ = ["PingmeshComponent"]
