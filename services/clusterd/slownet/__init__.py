"""ClusterD's slow-network component (FD-OL netfault), one module per part with one owner each:
:mod:`~clusterd.slownet.state` (super pods, config, parameters), :mod:`~clusterd.slownet.inputs`
(input files), :mod:`~clusterd.slownet.roce` (the RoCE plane), :mod:`~clusterd.slownet.http`
(``/v1/pingmesh``), :mod:`~clusterd.slownet.kube` (the pingmesh ConfigMaps) and
:mod:`~clusterd.slownet.component` (the analysis loop and the fault records; the module docstring
describes the whole)."""
