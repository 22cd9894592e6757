"""deviced: accelerator chip, network and switch faults through DCMI (issue 4).

Modules: :mod:`deviced.app` (the daemon: cycle, callbacks, probe, switch, hot reset, reporting, HTTP),
:mod:`deviced.engine` (the fault state machine: levels, recover delay, mend rules, frequency and
duration rules; no I/O, injected clock), :mod:`deviced.tables` (faultCode.json, faultCustomization.json
and SwitchFaultCode.json formats; defaults in ``deviced/data``), :mod:`deviced.backends` (``dcmi`` v1/v2
ctypes and ``sim``), :mod:`deviced.simapi` (the sim control HTTP API), :mod:`deviced.switch` (lingqu
switch faults), :mod:`deviced.resetcfg` (per-job reset-config files), :mod:`deviced.deviceinfo` (the
reference device-info document). The ctypes binding itself is :mod:`faultmesh.dcmi`.
"""
