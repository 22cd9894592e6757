"""Blocking NPU-backend calls for deviced: bounded pools, a timeout per call, errors counted.

Every DCMI / lingqu / hccn_tool call of deviced goes through :meth:`ChipIO.call`: it runs in a
:class:`faultmesh.runtime.BlockingPool` (4 workers; the gateway probe has its own 2 so a hanging probe
cannot starve the cycle), times out after ``--dcmi-timeout`` s (or the call's own ``timeout_s``), and
counts failures by (call, reason) for ``faultmesh_deviced_dcmi_errors``. A hanging call is skipped
for the cycle; the loop stays responsive (reference deviced.md §1.1).

:meth:`ChipIO.open` is the backend start (§1.1): load the library when it was missing, ``init``,
list the chips; retried with :class:`faultmesh.retry.Backoff` while the node condition
DCMIUnavailable says why this node reports no chips.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from deviced.backends import NpuBackend, make_backend
from faultmesh.dcmi.api import DeviceIds
from faultmesh.dcmi.loader import DcmiError, DeviceNotReady
from faultmesh.log import event
from faultmesh.retry import Backoff
from faultmesh.runtime import BlockingPool, BlockingTimeout

log = logging.getLogger("deviced")

CALL_ERRORS = (DcmiError, BlockingTimeout)  # what a failed backend call raises


class ChipIO:
    """The backend and its calls. ``backend`` may be None until :meth:`open` loads it; ``ids`` (logic
    id -> DeviceIds), ``spod`` (logic -> (super_pod_id, server_index)) and ``chip_names`` are filled
    by :meth:`open` / :meth:`describe`; ``call_errors`` counts failures by (call, reason)."""

    def __init__(self, args: argparse.Namespace, backend: NpuBackend | None) -> None:
        self.args = args
        self.backend = backend
        self.pool = BlockingPool(4, "dcmi")
        self.probe_pool = BlockingPool(2, "dcmi-probe")
        self.call_errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ids: dict[int, DeviceIds] = {}
        self.spod: dict[int, tuple[int, int]] = {}
        self.chip_names: dict[int, str] = {}

    async def call(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        timeout_s: float | None = None,
        pool: BlockingPool | None = None,
    ) -> Any:
        """Run blocking ``fn(*args)`` in ``pool`` (default the DCMI pool) with a timeout (s, default
        ``--dcmi-timeout``). Raises ``BlockingTimeout`` or ``DcmiError`` (counted by (name, reason))."""
        try:
            return await (pool or self.pool).call(timeout_s or self.args.dcmi_timeout, fn, *args)
        except BlockingTimeout:
            self.call_errors[(name, "timeout")] += 1
            raise
        except DeviceNotReady:
            self.call_errors[(name, "device not ready")] += 1
            raise
        except DcmiError as e:
            self.call_errors[(name, type(e).__name__)] += 1
            raise

    async def open(self, set_condition: Callable[..., bool], retry_s: float) -> list[DeviceIds]:
        """Load (when not loaded yet), ``init`` and list the chips; retried (first after ``retry_s`` s,
        backing off to 6x that) until it works, with the condition DCMIUnavailable set meanwhile
        (``set_condition(type, active, reason, message) -> changed``). Returns the chips."""
        backoff = Backoff(retry_s, retry_s * 6, jitter_s=retry_s * 0.1)
        while True:
            try:
                if self.backend is None:
                    self.backend = await self.call("load", make_backend, self.args)
                await self.call("init", self.backend.init)
                devices = await self.call("devices", self.backend.devices)
                break
            except (*CALL_ERRORS, ValueError) as e:
                reason = "library missing" if self.backend is None else "init failed"
                if set_condition("DCMIUnavailable", True, reason, str(e)):
                    event(log, logging.ERROR, "dcmi unavailable", reason=reason, error=str(e))
                await asyncio.sleep(backoff.next_delay())
        set_condition("DCMIUnavailable", False)
        self.ids = {d.logic: d for d in devices}
        return devices

    async def describe(self) -> None:
        """Read each chip's super-pod placement and chip name (failures: placement (-2, -2))."""
        assert self.backend is not None
        for d in self.ids.values():
            try:
                self.spod[d.logic] = await self.call("spod", self.backend.spod, d)
                self.chip_names[d.logic] = await self.call("chip_name", self.backend.chip_name, d)
            except CALL_ERRORS:
                self.spod[d.logic] = (-2, -2)

    async def health(self, ids: DeviceIds) -> bool | None:
        """The chip's card-drop state from one health read: True on -8012, False when it answered,
        None when the call failed otherwise."""
        assert self.backend is not None
        try:
            await self.call("health", self.backend.health, ids)
            return False
        except DeviceNotReady:
            return True
        except CALL_ERRORS:
            return None

    def shutdown(self) -> None:
        """Stop both pools (a hung call's thread is abandoned) and the backend's own thread, if any
        (the nvml event thread)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
        self.pool.shutdown()
        self.probe_pool.shutdown()
