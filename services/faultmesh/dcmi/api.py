"""Typed Python calls over the DCMI v1 functions deviced uses (reference deviced.md §1).

Every method is a blocking C call: run it through ``faultmesh.runtime.BlockingPool``. Errors are the
typed exceptions of :mod:`faultmesh.dcmi.loader` (``DeviceNotReady`` for -8012, ``NotSupported`` for
-8255, ``SymbolMissing``, ``DcmiError``). Device addressing: ``(card_id, device_id)`` for the C calls;
deviced keys its state by logic id and names chips by physical id (reference §10).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

from faultmesh.dcmi import structs
from faultmesh.dcmi.loader import Library, load_dcmi

c_int, c_uint, P = ctypes.c_int, ctypes.c_uint, ctypes.POINTER


class DeviceIds(NamedTuple):
    """One chip's ids: ``logic`` (state key), ``phy`` (name: Ascend910-<phy>), ``card``, ``device``."""

    logic: int
    phy: int
    card: int
    device: int


class DevFaultEvent(NamedTuple):
    """A decoded ``dcmi_dms_fault_event`` (reference §1 "Callback payload").

    ``event_id`` is the fault code (u32), ``logic_id`` the chip's logic id, ``severity`` 0..3,
    ``assertion`` 0 recover / 1 occur / 2 once, ``alarm_raised_time_s`` the driver's time (s).
    """

    event_id: int
    logic_id: int
    node_type: int
    node_id: int
    sub_node_type: int
    sub_node_id: int
    severity: int
    assertion: int
    event_serial_num: int
    notify_serial_num: int
    alarm_raised_time_s: int
    event_name: str


def decode_event(ev: structs.DcmiEvent) -> DevFaultEvent | None:
    """Copy a ``struct dcmi_event`` into a :class:`DevFaultEvent` (None when not a DMS fault event)."""
    if ev.type != structs.DCMI_DMS_FAULT_EVENT:
        return None
    d = ev.event_t.dms_event
    return DevFaultEvent(
        d.event_id,
        d.deviceid,
        d.node_type,
        d.node_id,
        d.sub_node_type,
        d.sub_node_id,
        d.severity,
        d.assertion,
        d.event_serial_num,
        d.notify_serial_num,
        d.alarm_raised_time,
        d.event_name.decode("utf-8", "replace"),
    )


class Dcmi:
    """The DCMI v1 calls of reference §1, bound on a loaded ``libdcmi.so``.

    ``Dcmi.open(path)`` loads the library (``path`` from ``--dcmi-lib``; raises ``LibraryMissing``).
    """

    def __init__(self, lib: Library) -> None:
        self.lib = lib
        f = lib.function
        self._init = f("dcmi_init")
        self._card_list = f("dcmi_get_card_list", P(c_int), P(c_int), c_int)
        self._dev_num = f("dcmi_get_device_num_in_card", c_int, P(c_int))
        self._logic_id = f("dcmi_get_device_logic_id", P(c_int), c_int, c_int)
        self._phy_from_logic = f("dcmi_get_device_phyid_from_logicid", c_uint, P(c_uint))
        self._logic_from_phy = f("dcmi_get_device_logicid_from_phyid", c_uint, P(c_uint))
        self._card_dev = f("dcmi_get_card_id_device_id_from_logicid", P(c_int), P(c_int), c_uint)
        self._health = f("dcmi_get_device_health", c_int, c_int, P(c_uint))
        self._errorcode = f("dcmi_get_device_errorcode_v2", c_int, c_int, P(c_int), P(c_uint), c_uint)
        self._subscribe = f(
            "dcmi_subscribe_fault_event",
            c_int,
            c_int,
            structs.DcmiEventFilter,
            structs.DcmiFaultEventCallback,
        )
        self._net_health = f("dcmi_get_device_network_health", c_int, c_int, P(c_int))
        self._boot = f("dcmi_get_device_boot_status", c_int, c_int, P(c_int))
        self._reset = f("dcmi_set_device_reset", c_int, c_int, c_int)
        self._resource = f(
            "dcmi_get_device_resource_info", c_int, c_int, P(structs.DcmiProcMemInfo), P(c_int)
        )
        self._info = f("dcmi_get_device_info", c_int, c_int, c_int, c_uint, ctypes.c_void_p, P(c_uint))
        self._brother = f("dcmi_get_netdev_brother_device", c_int, c_int, P(c_int))
        self._chip_info = f("dcmi_get_device_chip_info", c_int, c_int, P(structs.DcmiChipInfo))
        self._callback_ref: object | None = None  # keeps the CFUNCTYPE alive while subscribed
        self._lock = threading.Lock()
        self.unknown_events = 0  # callbacks whose event type is not DCMI_DMS_FAULT_EVENT

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> Dcmi:
        """Load ``libdcmi.so`` (see :func:`faultmesh.dcmi.loader.load_dcmi`) and bind its calls."""
        return cls(load_dcmi(path))

    def init(self) -> None:
        """``dcmi_init()``."""
        self._init()

    def card_list(self) -> list[int]:
        """``dcmi_get_card_list`` (list length 64); negative ids skipped; a count outside 1..64 is an error."""
        num = c_int(0)
        arr = (c_int * structs.CARD_LIST_LEN)()
        self._card_list(ctypes.byref(num), arr, structs.CARD_LIST_LEN)
        if not 1 <= num.value <= structs.CARD_LIST_LEN:
            raise ValueError(f"dcmi_get_card_list returned an invalid card count {num.value}")
        return [arr[i] for i in range(num.value) if arr[i] >= 0]

    def device_num_in_card(self, card: int) -> int:
        """``dcmi_get_device_num_in_card``; valid range 1..4 in the reference, faultmesh accepts 1..64."""
        n = c_int(0)
        self._dev_num(card, ctypes.byref(n))
        if not 1 <= n.value <= 64:
            raise ValueError(f"card {card}: invalid device count {n.value}")
        return n.value

    def logic_id(self, card: int, device: int) -> int:
        """``dcmi_get_device_logic_id``."""
        out = c_int(0)
        self._logic_id(ctypes.byref(out), card, device)
        return out.value

    def phy_id(self, logic: int) -> int:
        """``dcmi_get_device_phyid_from_logicid``."""
        out = c_uint(0)
        self._phy_from_logic(logic, ctypes.byref(out))
        return out.value

    def logic_from_phy(self, phy: int) -> int:
        """``dcmi_get_device_logicid_from_phyid``."""
        out = c_uint(0)
        self._logic_from_phy(phy, ctypes.byref(out))
        return out.value

    def card_device(self, logic: int) -> tuple[int, int]:
        """``dcmi_get_card_id_device_id_from_logicid`` -> (card, device)."""
        card, dev = c_int(0), c_int(0)
        self._card_dev(ctypes.byref(card), ctypes.byref(dev), logic)
        return card.value, dev.value

    def devices(self) -> list[DeviceIds]:
        """Walk cards × devices (reference §1) and return every chip's ids, sorted by logic id."""
        out: list[DeviceIds] = []
        for card in self.card_list():
            for dev in range(self.device_num_in_card(card)):
                logic = self.logic_id(card, dev)
                out.append(DeviceIds(logic, self.phy_id(logic), card, dev))
        return sorted(out)

    def health(self, card: int, device: int) -> int:
        """``dcmi_get_device_health``: 0 healthy. Raises ``DeviceNotReady`` on -8012 (card drop)."""
        out = c_uint(0)
        self._health(card, device, ctypes.byref(out))
        return out.value

    def error_codes(self, card: int, device: int) -> list[int]:
        """``dcmi_get_device_errorcode_v2`` (list of 128): the active fault codes, zeros dropped."""
        count = c_int(0)
        arr = (c_uint * structs.ERROR_CODE_LIST_LEN)()
        self._errorcode(card, device, ctypes.byref(count), arr, structs.ERROR_CODE_LIST_LEN)
        n = max(0, min(count.value, structs.ERROR_CODE_LIST_LEN))
        return [arr[i] for i in range(n) if arr[i] != 0]

    def subscribe(self, on_event: Callable[[DevFaultEvent], None]) -> None:
        """``dcmi_subscribe_fault_event(-1, -1, zero filter, cb)``: all devices, no filtering.

        ``on_event`` runs on the driver's C thread with a decoded copy of the event: it must only hand
        the event over (e.g. ``loop.call_soon_threadsafe``) and never call back into DCMI. Exceptions
        it raises are swallowed (a C thread cannot take them). Events of another type than
        ``DCMI_DMS_FAULT_EVENT`` are dropped and counted in ``unknown_events``.
        """

        def _cb(ptr):  # runs on a C thread, holding the GIL
            try:
                ev = decode_event(ptr.contents)
                if ev is None:
                    self.unknown_events += 1  # not a DMS fault event: counted, dropped
                else:
                    on_event(ev)
            except Exception:  # noqa: BLE001 - never let an exception unwind into C
                pass

        cfn = structs.DcmiFaultEventCallback(_cb)
        with self._lock:
            self._subscribe(-1, -1, structs.DcmiEventFilter(), cfn)
            self._callback_ref = cfn

    def network_health(self, card: int, device: int) -> int:
        """``dcmi_get_device_network_health``: the gateway-probe result (``RdfxDetectResult``)."""
        out = c_int(0)
        self._net_health(card, device, ctypes.byref(out))
        return out.value

    def boot_status(self, card: int, device: int) -> int:
        """``dcmi_get_device_boot_status`` (16 = boot finished, reference §1 ⚠)."""
        out = c_int(0)
        self._boot(card, device, ctypes.byref(out))
        return out.value

    def reset(self, card: int, device: int, channel: int = structs.INBAND_CHANNEL) -> None:
        """``dcmi_set_device_reset`` (channel 1 in-band, 0 out-of-band)."""
        self._reset(card, device, channel)

    def process_count(self, card: int, device: int) -> int:
        """``dcmi_get_device_resource_info``: number of processes on the chip (max 32)."""
        arr = (structs.DcmiProcMemInfo * structs.MAX_PROC_NUM)()
        n = c_int(structs.MAX_PROC_NUM)
        self._resource(card, device, arr, ctypes.byref(n))
        return max(0, n.value)

    def spod_info(self, card: int, device: int) -> structs.DcmiSpodInfo:
        """``dcmi_get_device_info(CHIP_INF=12, sub 1)``: super-pod info."""
        info = structs.DcmiSpodInfo()
        size = c_uint(ctypes.sizeof(info))
        self._info(
            card,
            device,
            structs.DCMI_MAIN_CMD_CHIP_INF,
            structs.DCMI_CHIP_INF_SUB_CMD_SPOD_INFO,
            ctypes.byref(info),
            ctypes.byref(size),
        )
        return info

    def brother_card(self, card: int, device: int) -> int:
        """``dcmi_get_netdev_brother_device``: the A3 card paired with this one."""
        out = c_int(0)
        self._brother(card, device, ctypes.byref(out))
        return out.value

    def chip_name(self, card: int, device: int) -> str:
        """``dcmi_get_device_chip_info``: the chip name (e.g. ``910B3``)."""
        info = structs.DcmiChipInfo()
        self._chip_info(card, device, ctypes.byref(info))
        return info.chip_name.decode("utf-8", "replace")


class DcmiV2:
    """The DCMI v2 calls (``dcmiv2_*``, A5 / Atlas 350/850/950), addressed by one ``dev_id`` (the
    logic id). Same Python surface as :class:`Dcmi` where it makes sense; device ids come back as
    ``DeviceIds(logic=dev_id, phy, card=dev_id, device=0)``. Reference deviced.md §1 (v2 family).
    """

    def __init__(self, lib: Library) -> None:
        self.lib = lib
        f = lib.function
        self._init = f("dcmiv2_init")
        self._list = f("dcmiv2_get_device_list", P(c_int), P(c_int), c_int)
        self._phy = f("dcmiv2_get_chip_phy_id_by_dev_id", c_uint, P(c_uint))
        self._health = f("dcmiv2_get_device_health", c_int, P(c_uint))
        self._errorcode = f("dcmiv2_get_device_error_code_list", c_int, P(c_int), P(c_uint), c_uint)
        self._subscribe = f(
            "dcmiv2_subscribe_fault_event", c_int, structs.DcmiEventFilter, structs.DcmiFaultEventCallback
        )
        self._net_health = f("dcmiv2_get_device_network_health", c_int, P(c_int))
        self._boot = f("dcmiv2_get_device_boot_status", c_int, P(c_int))
        self._reset = f("dcmiv2_reset_device", c_int, c_int)
        self._procs = f("dcmiv2_get_device_proc_mem_info", c_int, P(structs.DcmiProcMemInfo), P(c_int))
        self._callback_ref: object | None = None
        self._lock = threading.Lock()
        self.unknown_events = 0

    @staticmethod
    def supported(lib: Library) -> bool:
        """True when the library exports the v2 family (``dcmiv2_init``)."""
        return lib.has("dcmiv2_init")

    def init(self) -> None:
        """``dcmiv2_init()``."""
        self._init()

    def devices(self) -> list[DeviceIds]:
        """``dcmiv2_get_device_list`` (64) + physical ids, sorted by dev id."""
        num = c_int(0)
        arr = (c_int * structs.CARD_LIST_LEN)()
        self._list(arr, ctypes.byref(num), structs.CARD_LIST_LEN)
        if not 0 <= num.value <= structs.CARD_LIST_LEN:
            raise ValueError(f"dcmiv2_get_device_list returned an invalid count {num.value}")
        out = []
        for i in range(num.value):
            dev = arr[i]
            if dev < 0:
                continue
            phy = c_uint(0)
            self._phy(dev, ctypes.byref(phy))
            out.append(DeviceIds(dev, phy.value, dev, 0))
        return sorted(out)

    def health(self, dev: int) -> int:
        """``dcmiv2_get_device_health``; ``DeviceNotReady`` on -8012."""
        out = c_uint(0)
        self._health(dev, ctypes.byref(out))
        return out.value

    def error_codes(self, dev: int) -> list[int]:
        """``dcmiv2_get_device_error_code_list`` (128), zeros dropped."""
        count = c_int(0)
        arr = (c_uint * structs.ERROR_CODE_LIST_LEN)()
        self._errorcode(dev, ctypes.byref(count), arr, structs.ERROR_CODE_LIST_LEN)
        n = max(0, min(count.value, structs.ERROR_CODE_LIST_LEN))
        return [arr[i] for i in range(n) if arr[i] != 0]

    def subscribe(self, on_event: Callable[[DevFaultEvent], None]) -> None:
        """``dcmiv2_subscribe_fault_event(-1, zero filter, cb)``; same callback rules as :meth:`Dcmi.subscribe`."""

        def _cb(ptr):
            try:
                ev = decode_event(ptr.contents)
                if ev is None:
                    self.unknown_events += 1
                else:
                    on_event(ev)
            except Exception:  # noqa: BLE001 - never let an exception unwind into C
                pass

        cfn = structs.DcmiFaultEventCallback(_cb)
        with self._lock:
            self._subscribe(-1, structs.DcmiEventFilter(), cfn)
            self._callback_ref = cfn

    def network_health(self, dev: int) -> int:
        """``dcmiv2_get_device_network_health``."""
        out = c_int(0)
        self._net_health(dev, ctypes.byref(out))
        return out.value

    def boot_status(self, dev: int) -> int:
        """``dcmiv2_get_device_boot_status``."""
        out = c_int(0)
        self._boot(dev, ctypes.byref(out))
        return out.value

    def reset(self, dev: int, channel: int = structs.INBAND_CHANNEL) -> None:
        """``dcmiv2_reset_device``."""
        self._reset(dev, channel)

    def process_count(self, dev: int) -> int:
        """``dcmiv2_get_device_proc_mem_info``: processes on the chip."""
        arr = (structs.DcmiProcMemInfo * structs.MAX_PROC_NUM)()
        n = c_int(structs.MAX_PROC_NUM)
        self._procs(dev, arr, ctypes.byref(n))
        return max(0, n.value)
