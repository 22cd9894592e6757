"""deviced: accelerator chip, network and switch faults through DCMI (issue 4; shape of issue 12).

Modules: :mod:`deviced.app` (wiring, start / staged stop, ``main``), :mod:`deviced.flags` (flags),
:mod:`deviced.engine` (the only owner of device state: levels, recover delay, mend rules; no I/O,
injected clock) with :mod:`deviced.rules` (frequency / duration escalation, persistence) and
:mod:`deviced.state` (its records), :mod:`deviced.sources` (``SOURCES``: card drop, chip events,
link check, gateway probe, lingqu switch — they only emit into the engine), :mod:`deviced.cycle`,
:mod:`deviced.hotreset` (an action on the engine's API), :mod:`deviced.faults` (the one place that
builds faults), :mod:`deviced.sinks` (agent state, reset-config files, state file, device-info),
:mod:`deviced.backends` (the ``NpuBackend`` Protocol; ``dcmi`` v1/v2 ctypes and ``sim``),
:mod:`deviced.chipio` (bounded, timed backend calls), :mod:`deviced.control`, :mod:`deviced.reload`,
:mod:`deviced.http`, :mod:`deviced.metrics`, :mod:`deviced.simapi` (the sim control HTTP API),
:mod:`deviced.switch` (lingqu switch state), :mod:`deviced.tables` (the fault tables). The ctypes
binding itself is :mod:`faultmesh.dcmi`.
"""
