"""The registry of noded components: ``"module:Class"`` strings, started in this order.

A component class has ``name: str``, ``@staticmethod add_arguments(parser)``, ``__init__(self, app)``,
``async start()``, ``async stop()``, ``control_kinds: tuple[str, ...]`` (the ControlMessage body
kinds it handles) and ``async on_control(msg)``. ``app`` is :class:`noded.app.NodeD`. A component
whose module is not importable (not installed yet) is logged and skipped; noded runs without it.
"""

COMPONENTS: tuple[str, ...] = (
    "noded.pingmesh:PingmeshComponent",
    "noded.slownode:SlowNodeComponent",
)
