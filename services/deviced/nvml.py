"""deviced's NVIDIA backend (``deviced --backend nvml``, issue 33) through NVIDIA's own NVML binding,
nvidia-ml-py (import name ``pynvml``; the well-kept binding, so faultmesh writes no ctypes of its own
for NVML and loads ``libnvidia-ml.so.1`` the way NVIDIA's tools do).

:class:`NvmlBackend` satisfies :class:`deviced.backends.NpuBackend`: every method blocks and is run by
:class:`deviced.chipio.ChipIO` on the bounded pool with a timeout, like the DCMI calls. One GPU is one
"chip" (logic = phy = the NVML index, card = index, device 0). Its codes are those of
:mod:`deviced.nvml_table` (XIDs and NVML conditions).

- Events: :meth:`subscribe` makes an event set (``nvmlEventSetCreate``), registers every GPU for XID
  critical errors (``nvmlDeviceRegisterEvents``) and starts the thread ``nvml-events`` that waits
  (``nvmlEventSetWait``, 500 ms) and hands each event to the subscriber callback on that thread --
  deviced's :class:`deviced.sources.chip.ChipEvents` callback, so the same token bucket bounds a storm.
  A "once" XID (application level) is a one-off notice; a "reset" XID is held (reported by
  :meth:`error_codes`) until the GPU is seen reset: it answered NVML again after being lost. When no GPU
  accepts registration (events not supported) :meth:`subscribe` raises, and deviced polls.
- Polled health: :meth:`conditions` reads ECC counters, retired pages / remapped rows, NVLink state and
  error counters, the PCIe replay counter, the clock event (throttle) reasons and the temperature
  against its thresholds, and turns them into the table's conditions; ``NVML_ERROR_GPU_IS_LOST`` on any
  call is the condition ``gpu-lost``. :mod:`deviced.sources.nvml` runs it every cycle.
- Device info: UUID, serial, PCI bus id, name, NVLink links (``info``).

Errors: NVML errors become :class:`NvmlError` (a ``DcmiError``, so ChipIO counts them by call);
a missing ``libnvidia-ml.so.1`` or nvidia-ml-py is :class:`faultmesh.dcmi.loader.LibraryMissing`.
The backend never changes a card setting and never resets a GPU (:meth:`reset` refuses).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deviced.nvml_table import MAX_XID, NvidiaTable, xid_code
from deviced.state import OCCUR, ONCE
from faultmesh.dcmi.api import DevFaultEvent, DeviceIds
from faultmesh.dcmi.loader import DcmiError, LibraryMissing, NotSupported
from faultmesh.log import RateLimitedLog, event

log = logging.getLogger("deviced.nvml")

EVENT_WAIT_MS = 500
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
RC_NOT_SUPPORTED, RC_INVALID, RC_TIMEOUT = 3, 2, 10
RC_LIBRARY_NOT_FOUND, RC_FUNCTION_NOT_FOUND, RC_GPU_IS_LOST = 12, 13, 15
OPTIONAL_RCS = (RC_NOT_SUPPORTED, RC_INVALID, RC_FUNCTION_NOT_FOUND)
NVLINK_COUNTERS = (0, 1, 2, 3)  # DL replay, recovery, CRC flit, CRC data
# clock event reason bits (nvml.h nvmlClocksEventReason*)
SW_THERMAL, HW_THERMAL, HW_SLOWDOWN, POWER_BRAKE = 0x20, 0x40, 0x8, 0x80


class NvmlError(DcmiError):
    """An NVML call returned ``rc`` (NVML_ERROR_*)."""


class GpuLost(NvmlError):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus or the driver lost it."""


@dataclass
class GpuInfo:
    """One GPU's identity: ``index``, ``uuid``, ``serial``, ``pci_bus_id``, ``name``, ``nvlinks`` (links
    active when deviced started)."""

    index: int
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""
    name: str = ""
    nvlinks: list[int] = field(default_factory=list)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlBackend:
    """NVIDIA GPUs through NVML (see module docstring). ``table`` is the NVIDIA fault table;
    ``lib_path`` (``--nvml-lib``) loads that file instead of nvidia-ml-py's own lookup of
    ``libnvidia-ml.so.1``. Raises ``LibraryMissing`` when nvidia-ml-py is not installed.

    Counters: ``unknown_xids`` (XID -> events not in the table), ``event_errors`` (failed waits),
    ``events`` (events handed on). ``readings`` keeps each GPU's last polled values (the device check
    prints them); ``events_armed`` the GPUs registered for XID events."""

    name = "nvml"
    switch = None

    def __init__(self, table: NvidiaTable | None = None, lib_path: str | None = None) -> None:
        try:
            import pynvml
        except ImportError as e:
            raise LibraryMissing("nvidia-ml-py (pynvml)", str(e)) from None
        self.nv = pynvml
        self.table = table or NvidiaTable.load()
        self.lib_path = lib_path
        self.driver_version = ""
        self.handles: dict[int, Any] = {}
        self._by_addr: dict[int, int] = {}
        self.info: dict[int, GpuInfo] = {}
        self.readings: dict[int, dict[str, Any]] = {}
        self._prev: dict[int, dict[str, int]] = {}
        self._lock = threading.Lock()
        self.latched: dict[int, set[int]] = collections.defaultdict(set)
        self.lost: set[int] = set()
        self.unknown_xids: collections.Counter[int] = collections.Counter()
        self.events = 0
        self.event_errors = 0
        self.events_armed: set[int] = set()
        self.in_flight = 0  # health polls running (a hung one stays counted)
        self.last_wait_s = 0.0  # monotonic time the event thread last came back from a wait
        self._serial = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._evset: Any = None
        self._ratelog = RateLimitedLog(log, 30.0)

    # -- NVML calls ------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            rc = int(getattr(e, "value", -1))
            cls = GpuLost if rc == RC_GPU_IS_LOST else NotSupported if rc == RC_NOT_SUPPORTED else NvmlError
            raise cls(rc, getattr(fn, "__name__", str(fn)), f"{getattr(fn, '__name__', fn)}: {e}") from None

    def _opt(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call a GPU may not support: None for NOT_SUPPORTED / INVALID_ARGUMENT / FUNCTION_NOT_FOUND."""
        try:
            return self._call(fn, *args)
        except NvmlError as e:
            if e.rc in OPTIONAL_RCS:
                return None
            raise

    def init(self) -> None:
        """Load the library (``lib_path`` or nvidia-ml-py's lookup), ``nvmlInit``, list the GPUs and read
        their identity. Raises ``LibraryMissing`` (no libnvidia-ml.so.1) or :class:`NvmlError`."""
        nv = self.nv
        if self.lib_path and nv.nvmlLib is None:
            with nv.libLoadLock:
                try:
                    nv.nvmlLib = ctypes.CDLL(self.lib_path)
                except OSError as e:
                    raise LibraryMissing(self.lib_path, str(e)) from None
        try:
            self._call(nv.nvmlInit)
        except NvmlError as e:
            if e.rc == RC_LIBRARY_NOT_FOUND:
                raise LibraryMissing("libnvidia-ml.so.1", str(e)) from None
            raise
        self.driver_version = _text(self._opt(nv.nvmlSystemGetDriverVersion) or "")
        count = self._call(nv.nvmlDeviceGetCount)
        for i in range(count):
            h = self._call(nv.nvmlDeviceGetHandleByIndex, i)
            self.handles[i] = h
            self._by_addr[ctypes.cast(h, ctypes.c_void_p).value or 0] = i
            self.info[i] = self._identity(i, h)

    def _identity(self, i: int, h: Any) -> GpuInfo:
        nv = self.nv
        info = GpuInfo(i)
        try:
            info.uuid = _text(self._opt(nv.nvmlDeviceGetUUID, h) or "")
            info.serial = _text(self._opt(nv.nvmlDeviceGetSerial, h) or "")
            info.name = _text(self._opt(nv.nvmlDeviceGetName, h) or "")
            pci = self._opt(nv.nvmlDeviceGetPciInfo, h)
            info.pci_bus_id = _text(pci.busId) if pci is not None else ""
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                state = self._opt(nv.nvmlDeviceGetNvLinkState, h, link)
                if state is None:
                    break
                if state:
                    info.nvlinks.append(link)
        except GpuLost:
            self.lost.add(i)
        return info

    def devices(self) -> list[DeviceIds]:
        """One DeviceIds per GPU: logic = phy = card = NVML index, device 0."""
        return [DeviceIds(i, i, i, 0) for i in sorted(self.handles)]

    # -- events ----------------------------------------------------------------------------------
    def subscribe(self, cb: Callable[[DevFaultEvent], None]) -> None:
        """Register every GPU for XID events and start the waiting thread (it calls ``cb`` on itself).
        Raises :class:`NvmlError` when no GPU accepts (events unsupported: deviced polls instead)."""
        nv = self.nv
        if self._thread is not None and self._thread.is_alive():
            return
        evset = self._call(nv.nvmlEventSetCreate)
        armed: set[int] = set()
        for i, h in self.handles.items():
            try:
                supported = self._opt(nv.nvmlDeviceGetSupportedEventTypes, h)
                if supported is not None and not supported & XID_EVENT:
                    continue
                self._call(nv.nvmlDeviceRegisterEvents, h, XID_EVENT, evset)
                armed.add(i)
            except NvmlError as e:
                event(log, logging.WARNING, "nvml event registration failed", gpu=i, error=str(e))
        if not armed:
            self._opt(nv.nvmlEventSetFree, evset)
            raise NotSupported(RC_NOT_SUPPORTED, "nvmlDeviceRegisterEvents", "no GPU accepts XID events")
        self._evset, self.events_armed = evset, armed
        self._stop.clear()
        self.last_wait_s = time.monotonic()
        self._thread = threading.Thread(
            target=self._wait_loop, args=(evset, cb), name="nvml-events", daemon=True
        )
        self._thread.start()
        event(log, logging.INFO, "nvml xid subscription armed", gpus=",".join(map(str, sorted(armed))))

    def _wait_loop(self, evset: Any, cb: Callable[[DevFaultEvent], None]) -> None:
        nv = self.nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait(evset, EVENT_WAIT_MS)
            except nv.NVMLError as e:
                self.last_wait_s = time.monotonic()
                if getattr(e, "value", None) == RC_TIMEOUT:
                    continue
                self.event_errors += 1
                self._ratelog.warning(
                    "wait", "nvml event wait failed", error=str(e), errors=self.event_errors
                )
                self._stop.wait(0.5)
                continue
            self.last_wait_s = time.monotonic()
            ev = self._decode(data)
            if ev is not None:
                self.events += 1
                cb(ev)
        try:
            self._opt(nv.nvmlEventSetFree, evset)
        except NvmlError:
            pass

    def _decode(self, data: Any) -> DevFaultEvent | None:
        """One NVML event -> a DevFaultEvent of the XID's code (None: not an XID of a known GPU)."""
        i = self._by_addr.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0)
        if i is None or not data.eventType & XID_EVENT:
            return None
        xid = int(data.eventData)
        entry = self.table.entries.get(xid_code(min(xid, MAX_XID)))
        if entry is None or xid > MAX_XID:
            self.unknown_xids[xid] += 1
            if self.unknown_xids[xid] == 1:
                event(log, logging.WARNING, "nvml xid not in table", gpu=i, xid=xid,
                      level=self.table.default.level.name)  # fmt: skip
            if xid > MAX_XID:
                return None
        clear = entry.clear if entry is not None else self.table.default.clear
        code = xid_code(xid)
        if clear == "reset":
            with self._lock:
                self.latched[i].add(code)
        self._serial += 1
        return DevFaultEvent(
            code, i, 0, 0, 0, 0, 3, ONCE if clear == "once" else OCCUR, self._serial, 0, int(time.time()),
            f"xid {xid}",
        )  # fmt: skip

    def close(self, join_s: float = 0.0) -> None:
        """Stop the event thread: it ends within one wait (500 ms) and frees the event set; waits up to
        ``join_s`` s for that (0: returns at once, safe on the event loop)."""
        self._stop.set()
        t = self._thread
        if t is not None and join_s > 0:
            t.join(join_s)
        self._thread = None

    # -- polled health ---------------------------------------------------------------------------
    def conditions(self, ids: DeviceIds) -> tuple[set[int], list[int]]:
        """Poll GPU ``ids.logic``: (its active condition codes, the held "reset" XID codes that ended
        because the GPU answered again after being lost). Raises :class:`NvmlError` for a failure
        other than a lost GPU (which is the condition ``gpu-lost``)."""
        i = ids.logic
        with self._lock:
            self.in_flight += 1
        try:
            try:
                r = self._read(i, self.handles[i])
            except GpuLost:
                self.lost.add(i)
                self.readings[i] = {"lost": True}
                return {self.table.conditions["gpu-lost"]}, []
            self.readings[i] = r
            cleared: list[int] = []
            if i in self.lost:
                self.lost.discard(i)
                with self._lock:
                    cleared = sorted(self.latched.pop(i, set()))
                event(log, logging.INFO, "nvml gpu answers again", gpu=i, cleared=len(cleared))
            return self._judge(i, r), cleared
        finally:
            with self._lock:
                self.in_flight -= 1

    def _read(self, i: int, h: Any) -> dict[str, Any]:
        nv, opt = self.nv, self._opt
        ecc = nv.nvmlDeviceGetTotalEccErrors
        unc, cor = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        vol, agg = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
        r: dict[str, Any] = {
            "ecc_dbe_volatile": opt(ecc, h, unc, vol),
            "ecc_sbe_volatile": opt(ecc, h, cor, vol),
            "ecc_dbe_aggregate": opt(ecc, h, unc, agg),
            "ecc_sbe_aggregate": opt(ecc, h, cor, agg),
            "retired_pages_pending": opt(nv.nvmlDeviceGetRetiredPagesPendingStatus, h),
            "remapped_rows": opt(nv.nvmlDeviceGetRemappedRows, h),
            "pcie_replay": opt(nv.nvmlDeviceGetPcieReplayCounter, h),
            "temperature": opt(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "temp_slowdown": opt(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            "temp_shutdown": opt(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        }  # fmt: skip
        reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        r["clock_event_reasons"] = opt(reasons, h)
        links: dict[int, dict[str, int]] = {}
        for link in self.info[i].nvlinks if i in self.info else []:
            state = opt(nv.nvmlDeviceGetNvLinkState, h, link)
            errs = sum(opt(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, c) or 0 for c in NVLINK_COUNTERS)
            links[link] = {"active": int(state or 0), "errors": errs}
        r["nvlinks"] = links
        return r

    def _judge(self, i: int, r: dict[str, Any]) -> set[int]:
        """The conditions of one GPU's readings (thresholds from the table; counters as deltas)."""
        cond, th = self.table.conditions, self.table.thresholds
        out: set[int] = set()
        prev = self._prev.setdefault(i, {})

        def delta(key: str, now: int | None) -> int:
            if now is None:
                return 0
            before = prev.get(key, now)
            prev[key] = now
            return max(0, now - before)

        if (r["ecc_dbe_volatile"] or 0) > 0:
            out.add(cond["ecc-dbe-volatile"])
        if (r["ecc_sbe_volatile"] or 0) > th.get("sbe_volatile", 1000):
            out.add(cond["ecc-sbe-high"])
        if r["retired_pages_pending"]:
            out.add(cond["retired-pages-pending"])
        rows = r["remapped_rows"]
        if rows is not None:
            if rows[2]:
                out.add(cond["remap-pending"])
            if rows[3]:
                out.add(cond["remap-failure"])
        if any(not v["active"] for v in r["nvlinks"].values()):
            out.add(cond["nvlink-down"])
        nvl = sum(v["errors"] for v in r["nvlinks"].values()) if r["nvlinks"] else None
        if delta("nvlink_errors", nvl) > th.get("nvlink_errors", 100):
            out.add(cond["nvlink-errors"])
        if delta("pcie_replay", r["pcie_replay"]) > th.get("pcie_replay", 100):
            out.add(cond["pcie-replay"])
        reasons = r["clock_event_reasons"] or 0
        if reasons & (SW_THERMAL | HW_THERMAL):
            out.add(cond["thermal-slowdown"])
        if reasons & HW_SLOWDOWN:
            out.add(cond["hw-slowdown"])
        if reasons & POWER_BRAKE:
            out.add(cond["power-brake"])
        t = r["temperature"]
        if t is not None and r["temp_shutdown"] and t >= r["temp_shutdown"]:
            out.add(cond["temp-shutdown"])
        elif t is not None and r["temp_slowdown"] and t >= r["temp_slowdown"]:
            out.add(cond["temp-slowdown"])
        return out

    # -- the rest of NpuBackend -------------------------------------------------------------------
    def health(self, ids: DeviceIds) -> int:
        """0: NVML has no single health word; a GPU's health is its conditions (polled by
        :mod:`deviced.sources.nvml`), and a lost GPU is the condition ``gpu-lost``, not a card drop."""
        return 0

    def error_codes(self, ids: DeviceIds) -> list[int]:
        """The GPU's live codes for a mend poll: its conditions now and its held "reset" XIDs."""
        conds, _cleared = self.conditions(ids)
        with self._lock:
            return sorted(conds | self.latched.get(ids.logic, set()))

    def network_health(self, ids: DeviceIds) -> int:
        """0 (healthy): NVIDIA GPUs have no RoCE gateway probe of their own."""
        return 0

    def process_count(self, ids: DeviceIds) -> int:
        """Compute processes on the GPU."""
        procs = self._call(self.nv.nvmlDeviceGetComputeRunningProcesses, self.handles[ids.logic])
        return len(procs or [])

    def boot_status(self, ids: DeviceIds) -> int:
        """16 (booted) while NVML answers for the GPU (the DCMI boot word has no NVML counterpart)."""
        return 16

    def reset(self, ids: DeviceIds) -> None:
        """Refused: faultmesh never resets an NVIDIA GPU (the operator's nvidia-smi -r does)."""
        raise NotSupported(RC_NOT_SUPPORTED, "nvmlDeviceResetGpu", "deviced does not reset NVIDIA GPUs")

    def spod(self, ids: DeviceIds) -> tuple[int, int]:
        """(-1, -1): no super-pod placement."""
        return -1, -1

    def chip_name(self, ids: DeviceIds) -> str:
        """The GPU's product name (e.g. "NVIDIA H100 80GB HBM3")."""
        info = self.info.get(ids.logic)
        return info.name if info else ""

    def link_up(self, ids: DeviceIds) -> bool | None:
        """None: no hccn_tool link state (NVLink is a condition of :meth:`conditions`)."""
        return None
