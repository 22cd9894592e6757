"""noded pingmesh (reference noded.md §6): the :class:`Pingmesh` source and its result files."""

from noded.pingmesh.component import Pingmesh

__all__ = ["Pingmesh"]
