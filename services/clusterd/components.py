"""The registry of ClusterD components: ``"module:Class"`` strings, started in this order.

A component class has ``name``, ``@staticmethod add_arguments(parser)``, ``__init__(self, cd)``
(register servicers, routes and subscriptions there), ``async start()`` and ``async stop()``.
"""

COMPONENTS: tuple[str, ...] = (
    "clusterd.pubfault:PubFaultComponent",
    "clusterd.kube:KubeComponent",
    "clusterd.brain.component:BrainComponent",
    "clusterd.slownode:SlowNodeComponent",
    "clusterd.slownet:SlowNetComponent",
)
