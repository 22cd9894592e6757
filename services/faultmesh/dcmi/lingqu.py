"""ctypes calls of the lingqu switch library ``liblingqu-dcmi.so`` (reference deviced.md §1, §7; A3).

Blocking calls: run them through ``BlockingPool``. Errors: the typed ``DcmiError`` family.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

from faultmesh.dcmi import structs
from faultmesh.dcmi.loader import Library, load_lingqu


class SwitchEvent(NamedTuple):
    """A decoded ``LqDcmiEvent``: ``event_type`` (alarm id 0..19), ``fault_id`` (0xFFFFFFFF = na),
    peer device type / port, switch chip / port, ``severity``, ``assertion`` (0 recover, 1 occur,
    2 once), serial numbers and ``alarm_raised_time`` (as given by the library; 0 = unknown).
    """

    event_type: int
    fault_id: int
    peer_device: int
    peer_port: int
    switch_chip: int
    switch_port: int
    severity: int
    assertion: int
    event_serial_num: int
    notify_serial_num: int
    alarm_raised_time: int


def decode_switch_event(ev: structs.LqDcmiEvent) -> SwitchEvent:
    """Copy an ``LqDcmiEvent`` into a :class:`SwitchEvent`."""
    return SwitchEvent(
        ev.eventType,
        ev.subType,
        ev.peerportDevice,
        ev.peerportId,
        ev.switchChipid,
        ev.switchPortid,
        ev.severity,
        ev.assertion,
        ev.eventSerialNum,
        ev.notifySerialNum,
        ev.alarmRaisedTime,
    )


class Lingqu:
    """``lq_dcmi_init``, ``lq_dcmi_subscribe_fault_event`` and ``lq_dcmi_get_fault_info``."""

    def __init__(self, lib: Library) -> None:
        self.lib = lib
        self._init = lib.function("lq_dcmi_init")
        self._subscribe = lib.function(
            "lq_dcmi_subscribe_fault_event", structs.LqDcmiEventFilter, structs.LqFaultEventCallback
        )
        self._fault_info = lib.function(
            "lq_dcmi_get_fault_info",
            ctypes.c_uint,
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(structs.LqDcmiEvent),
        )
        self._callback_ref: object | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> Lingqu:
        """Load ``liblingqu-dcmi.so`` (raises ``LibraryMissing``) and bind its calls."""
        return cls(load_lingqu(path))

    def init(self) -> None:
        """``lq_dcmi_init()``."""
        self._init()

    def subscribe(self, on_event: Callable[[SwitchEvent], None]) -> None:
        """Subscribe with a zeroed filter; ``on_event`` runs on a C thread (hand over only)."""

        def _cb(ptr):
            try:
                on_event(decode_switch_event(ptr.contents))
            except Exception:  # noqa: BLE001 - never unwind into C
                pass

        cfn = structs.LqFaultEventCallback(_cb)
        with self._lock:
            self._subscribe(structs.LqDcmiEventFilter(), cfn)
            self._callback_ref = cfn

    def fault_info(self) -> list[SwitchEvent]:
        """``lq_dcmi_get_fault_info(128, ...)``: the current switch faults."""
        arr = (structs.LqDcmiEvent * structs.LINGQU_LIST_LEN)()
        n = ctypes.c_uint(0)
        self._fault_info(structs.LINGQU_LIST_LEN, ctypes.byref(n), arr)
        return [decode_switch_event(arr[i]) for i in range(min(n.value, structs.LINGQU_LIST_LEN))]
