"""NVIDIA GPU health by polling (issue 33): the conditions of :meth:`deviced.nvml.NvmlBackend.conditions`
(ECC, retired pages / remapped rows, NVLink, PCIe replays, clock event reasons, temperature, GPU lost)
become occur / recover events of the engine, every ``--nvml-poll-interval`` s inside the cycle.

Runs only with ``--backend nvml``. Every NVML call goes through ``ChipIO.call`` (the bounded pool, a
timeout of ``--dcmi-timeout`` s). A timeout or an NVML error marks the source down
(``faultmesh_source_up{source="nvml"}`` 0, logged once per change); while a timed-out call still hangs
in its thread no new poll starts (so hung calls cannot eat the pool), and the source stays down. The
event thread's liveness is checked too: a wait that has not come back for 10 s marks the source down.
XID events themselves come by the chip subscription (:class:`deviced.sources.chip.ChipEvents`).

:func:`add_gpu_route` adds deviced's read-only ``GET /v1/gpus``: each GPU's identity (UUID, serial,
PCI bus id, name, NVLinks active at start), whether it is lost, its last readings, and whether its
XID events are armed.
"""

from __future__ import annotations

import logging
import time

from deviced.chipio import CALL_ERRORS
from deviced.engine import OCCUR, RECOVER, DeviceEvent
from deviced.nvml import EVENT_WAIT_MS
from deviced.sources.base import Deps
from faultmesh.httplite import App, Request, Response, json_response
from faultmesh.log import event
from faultmesh.source import PushSource, Support

log = logging.getLogger("deviced")

WAIT_STUCK_S = 10.0  # an event wait (500 ms) not back after this is a hung NVML


class NvmlHealth(PushSource):
    """The NVML condition poll (see module docstring). ``polls`` / ``failures`` count rounds."""

    name = "nvml"
    fault_sources = ()  # the engine's sink reports (and readies) dcmi / lingqu

    def __init__(self, deps: Deps) -> None:
        super().__init__()
        self.deps = deps
        self.monotonic = time.monotonic
        self.polls = 0
        self.failures = 0
        self.up: bool | None = None
        self._last_poll = -1e18
        self._conds: dict[int, set[int]] = {}

    def supported(self) -> Support:
        """Only with ``--backend nvml``."""
        ok = getattr(self.deps.args, "backend", "") == "nvml"
        return Support(ok, "" if ok else "backend is not nvml")

    def _set_up(self, up: bool, why: str = "") -> None:
        if self.ctx is not None and self.ctx.metrics is not None:
            self.ctx.metrics.up.labels(self.name).set(1 if up else 0)
        if up != self.up:
            event(log, logging.INFO if up else logging.WARNING,
                  "nvml source up" if up else "nvml source down", reason=why)  # fmt: skip
        self.up = up

    async def on_cycle(self) -> None:
        """One poll round when due: each GPU's conditions diffed into occur / recover events."""
        io, eng = self.deps.io, self.deps.engine
        backend = io.backend
        if self.ctx is None or backend is None or not hasattr(backend, "conditions"):
            return
        now_s = self.monotonic()
        if now_s - self._last_poll < float(getattr(self.deps.args, "nvml_poll_interval", 5.0)):
            return
        self._last_poll = now_s
        if backend.in_flight > 0:
            self.failures += 1
            self._set_up(False, "an NVML call still hangs")
            return
        ok, why, changed = True, "", False
        for logic, ids in io.ids.items():
            try:
                conds, cleared = await io.call("nvml_health", backend.conditions, ids)
            except CALL_ERRORS as e:
                ok, why = False, str(e)
                event(log, logging.WARNING, "nvml health poll failed", gpu=logic, error=str(e))
                break  # a timed-out call hangs in the pool: stop this round
            prev = self._conds.get(logic, set())
            now = eng.now()
            for c in sorted(conds - prev):
                changed |= eng.submit(DeviceEvent(logic, c, OCCUR, 0, now, "nvml-poll"))
            for c in sorted((prev - conds) | set(cleared)):
                changed |= eng.submit(DeviceEvent(logic, c, RECOVER, 0, now, "nvml-poll"))
            self._conds[logic] = conds
        self.polls += 1
        stuck = backend.events_armed and now_s - backend.last_wait_s > max(WAIT_STUCK_S, EVENT_WAIT_MS / 100)
        if ok and stuck:
            ok, why = False, "nvml event wait does not return"
        if not ok:
            self.failures += 1
        self._set_up(ok, why)
        if changed:
            self.deps.wake_urgent()


def gpu_views(io, node: str) -> dict:
    """The ``GET /v1/gpus`` document of ``io.backend`` (an NvmlBackend, or None before it loaded)."""
    b = io.backend
    gpus = []
    for i, info in sorted(getattr(b, "info", {}).items()):
        gpus.append(
            {
                "index": i,
                "uuid": info.uuid,
                "serial": info.serial,
                "pci_bus_id": info.pci_bus_id,
                "name": info.name,
                "nvlinks": list(info.nvlinks),
                "lost": i in b.lost,
                "xid_events_armed": i in b.events_armed,
                "readings": dict(b.readings.get(i, {})),
            }
        )
    return {"node": node, "driver_version": getattr(b, "driver_version", ""), "gpus": gpus}


def add_gpu_route(app: App, io, node: str) -> None:
    """Add ``GET /v1/gpus`` (read only; see module docstring)."""

    async def gpus(_request: Request) -> Response:
        return json_response(gpu_views(io, node))

    app.router.add_get("/v1/gpus", gpus)
