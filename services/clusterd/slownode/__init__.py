"""ClusterD's slow-node component (FD-OL slownode, cluster part), one module per part with one
owner each: :mod:`~clusterd.slownode.jobs` (the per-job state, FeatConf helpers, fault codes, the
status document), :mod:`~clusterd.slownode.datatrace` (the data-trace switch),
:mod:`~clusterd.slownode.edge` (node results in, cluster rounds, faults out),
:mod:`~clusterd.slownode.inputs` (the watched FeatConf directory), :mod:`~clusterd.slownode.http`
(``/v1/slownode``) and :mod:`~clusterd.slownode.component` (the jobs, their store records and noded
control; the module docstring describes the whole). The ``ras-feature-slownode-<job>`` ConfigMaps
are read by :mod:`clusterd.kube.control`, which drives the component's ``enable`` / ``disable``."""
