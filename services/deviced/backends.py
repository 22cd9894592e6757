"""deviced backends: the ctypes DCMI binding (``dcmi`` v1 and v2), a pure-Python simulator (``sim``) and
NVIDIA GPUs through NVML (``nvml``, :mod:`deviced.nvml`).

All satisfy :class:`NpuBackend` (the Protocol the sources are written against) and expose the same
blocking methods, called by the app through a ``BlockingPool`` (never on the
event loop). Event callbacks arrive on a foreign thread (the driver's C thread, or the simulator's
firing thread) and must only be handed to the loop.

Methods: ``init()``, ``devices() -> list[DeviceIds]``, ``health(ids) -> int`` (raises
``DeviceNotReady`` on a card drop), ``error_codes(ids) -> list[int]``, ``subscribe(cb)``,
``network_health(ids) -> int`` (``RdfxDetectResult``), ``process_count(ids)``, ``boot_status(ids)``,
``reset(ids)``, ``spod(ids) -> (super_pod_id, server_index)`` (-1 unset, -2 failed, reference §5.1),
``chip_name(ids)``, ``link_up(ids) -> bool | None`` (hccn_tool link state); ``switch`` is None or an object with ``init()``, ``subscribe(cb)``,
``fault_info() -> list[SwitchEvent]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from faultmesh.dcmi.api import Dcmi, DcmiV2, DevFaultEvent, DeviceIds
from faultmesh.dcmi.lingqu import Lingqu, SwitchEvent
from faultmesh.dcmi.loader import DcmiError, DeviceNotReady, LibraryMissing, load_dcmi

UNSET = 0xFFFFFFFF


HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
_LINK_RE = re.compile(r"link status:\s*(UP|DOWN)", re.IGNORECASE)


@runtime_checkable
class SwitchBackend(Protocol):
    """The lingqu switch calls (blocking): ``init()``, ``subscribe(cb)`` (cb runs on a foreign thread),
    ``fault_info() -> list[SwitchEvent]`` (the full current list). Raise ``DcmiError`` on failure."""

    def init(self) -> None: ...
    def subscribe(self, cb: Callable[[SwitchEvent], None]) -> None: ...
    def fault_info(self) -> list[SwitchEvent]: ...


@runtime_checkable
class NpuBackend(Protocol):
    """What deviced needs of an NPU driver (dcmi v1, dcmi v2, sim). Every call blocks and is run in a
    ``BlockingPool`` with a timeout; failures raise ``DcmiError`` (``DeviceNotReady`` for health -8012).

    ``name``; ``switch`` (a :class:`SwitchBackend` or None); ``init()``; ``devices() -> [DeviceIds]``;
    ``health(ids) -> int`` (0 healthy); ``error_codes(ids) -> [int]``; ``subscribe(cb)`` (fault events
    as :class:`DevFaultEvent` on a foreign thread); ``network_health(ids) -> int`` (RdfxDetectResult);
    ``process_count(ids) -> int``; ``boot_status(ids) -> int``; ``reset(ids)``; ``spod(ids) ->
    (super_pod_id, server_index)``; ``chip_name(ids) -> str``; ``link_up(ids) -> bool | None``.
    """

    name: str
    switch: SwitchBackend | None

    def init(self) -> None: ...
    def devices(self) -> list[DeviceIds]: ...
    def health(self, ids: DeviceIds) -> int: ...
    def error_codes(self, ids: DeviceIds) -> list[int]: ...
    def subscribe(self, cb: Callable[[DevFaultEvent], None]) -> None: ...
    def network_health(self, ids: DeviceIds) -> int: ...
    def process_count(self, ids: DeviceIds) -> int: ...
    def boot_status(self, ids: DeviceIds) -> int: ...
    def reset(self, ids: DeviceIds) -> None: ...
    def spod(self, ids: DeviceIds) -> tuple[int, int]: ...
    def chip_name(self, ids: DeviceIds) -> str: ...
    def link_up(self, ids: DeviceIds) -> bool | None: ...


def make_backend(args: argparse.Namespace) -> NpuBackend:
    """Build the backend of ``--backend`` (sim; nvml: :class:`deviced.nvml.NvmlBackend`; or dcmi by
    ``--dcmi-api``). Raises ``DcmiError`` (e.g. LibraryMissing) for dcmi and nvml."""
    if args.backend == "sim":
        if args.sim_vendor == "nvidia":  # a simulated GPU node (mixed fleet)
            return SimBackend(args.sim_cards, args.sim_devices_per_card, chip="H100", wide_codes=True)
        return SimBackend(args.sim_cards, args.sim_devices_per_card)
    if args.backend == "nvml":
        from deviced.nvml import NvmlBackend  # imports nvidia-ml-py only for this backend
        from deviced.nvml_table import NvidiaTable

        return NvmlBackend(NvidiaTable.load(args.nvml_fault_table), args.nvml_lib)
    return open_dcmi_backend(
        args.dcmi_api,
        args.dcmi_lib,
        args.lingqu_lib,
        want_switch=not args.no_switch,
        hccn_tool=args.hccn_tool,
    )


def hccn_link_up(tool: str, phy: int, timeout_s: float = 5.0) -> bool | None:
    """``hccn_tool -i <phy> -link -g`` -> True (UP), False (DOWN), None (tool absent, failed or unparsable).

    Reference deviced.md §1 "Link state without DCMI"; the reference treats a failed exec as DOWN,
    which raises a link-down on every chip of a node without the tool -- faultmesh reports "unknown".
    """
    if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
        return None
    try:
        out = subprocess.run(
            [tool, "-i", str(phy), "-link", "-g"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _LINK_RE.search(out.stdout)
    if out.returncode != 0 or m is None:
        return None
    return m.group(1).upper() == "UP"


class DcmiBackend:
    """The real driver through :class:`faultmesh.dcmi.api.Dcmi` (and lingqu when its library loads)."""

    name = "dcmi"

    def __init__(
        self,
        dcmi_lib: str | None = None,
        lingqu_lib: str | None = None,
        want_switch: bool = True,
        hccn_tool: str = HCCN_TOOL,
    ):
        self.hccn_tool = hccn_tool
        self.dcmi = Dcmi.open(dcmi_lib)
        self.switch: Lingqu | None = None
        self.switch_error = ""
        if want_switch:
            try:
                self.switch = Lingqu.open(lingqu_lib)
            except LibraryMissing as e:
                self.switch_error = str(e)

    def init(self) -> None:
        self.dcmi.init()

    def devices(self) -> list[DeviceIds]:
        return self.dcmi.devices()

    def health(self, ids: DeviceIds) -> int:
        return self.dcmi.health(ids.card, ids.device)

    def error_codes(self, ids: DeviceIds) -> list[int]:
        return self.dcmi.error_codes(ids.card, ids.device)

    def subscribe(self, cb: Callable[[DevFaultEvent], None]) -> None:
        self.dcmi.subscribe(cb)

    def network_health(self, ids: DeviceIds) -> int:
        return self.dcmi.network_health(ids.card, ids.device)

    def process_count(self, ids: DeviceIds) -> int:
        return self.dcmi.process_count(ids.card, ids.device)

    def boot_status(self, ids: DeviceIds) -> int:
        return self.dcmi.boot_status(ids.card, ids.device)

    def reset(self, ids: DeviceIds) -> None:
        self.dcmi.reset(ids.card, ids.device)

    def spod(self, ids: DeviceIds) -> tuple[int, int]:
        try:
            info = self.dcmi.spod_info(ids.card, ids.device)
        except DcmiError:
            return -2, -2

        def conv(v: int) -> int:
            return -1 if v == UNSET else v

        return conv(info.super_pod_id), conv(info.server_id)

    def chip_name(self, ids: DeviceIds) -> str:
        try:
            return self.dcmi.chip_name(ids.card, ids.device)
        except DcmiError:
            return ""

    def link_up(self, ids: DeviceIds) -> bool | None:
        return hccn_link_up(self.hccn_tool, ids.phy)


class DcmiV2Backend:
    """The A5 driver through :class:`faultmesh.dcmi.api.DcmiV2` (one dev id per chip; no lingqu)."""

    name = "dcmi-v2"
    switch = None

    def __init__(self, lib, hccn_tool: str = HCCN_TOOL) -> None:
        self.dcmi = DcmiV2(lib)
        self.hccn_tool = hccn_tool

    def init(self) -> None:
        self.dcmi.init()

    def devices(self) -> list[DeviceIds]:
        return self.dcmi.devices()

    def health(self, ids: DeviceIds) -> int:
        return self.dcmi.health(ids.logic)

    def error_codes(self, ids: DeviceIds) -> list[int]:
        return self.dcmi.error_codes(ids.logic)

    def subscribe(self, cb: Callable[[DevFaultEvent], None]) -> None:
        self.dcmi.subscribe(cb)

    def network_health(self, ids: DeviceIds) -> int:
        return self.dcmi.network_health(ids.logic)

    def process_count(self, ids: DeviceIds) -> int:
        return self.dcmi.process_count(ids.logic)

    def boot_status(self, ids: DeviceIds) -> int:
        return self.dcmi.boot_status(ids.logic)

    def reset(self, ids: DeviceIds) -> None:
        self.dcmi.reset(ids.logic)

    def spod(self, ids: DeviceIds) -> tuple[int, int]:
        return -2, -2

    def chip_name(self, ids: DeviceIds) -> str:
        return ""

    def link_up(self, ids: DeviceIds) -> bool | None:
        return hccn_link_up(self.hccn_tool, ids.phy)


def open_dcmi_backend(
    api: str = "auto",
    dcmi_lib: str | None = None,
    lingqu_lib: str | None = None,
    want_switch: bool = True,
    hccn_tool: str = HCCN_TOOL,
):
    """The DCMI backend for ``api``: v1, v2, or auto = v1 when the library exports ``dcmi_init``, else
    v2 when it exports ``dcmiv2_init`` (newer drivers may export both; A5 nodes should say v2 --
    the reference chooses the family by chip type). Raises ``LibraryMissing`` when libdcmi.so
    cannot be loaded."""
    lib = load_dcmi(dcmi_lib)
    if api == "v2" or (api == "auto" and not lib.has("dcmi_init") and DcmiV2.supported(lib)):
        return DcmiV2Backend(lib, hccn_tool)
    return DcmiBackend(dcmi_lib, lingqu_lib, want_switch=want_switch, hccn_tool=hccn_tool)


class SimDevice:
    """One simulated chip: live codes, health code, network-probe result, process count, boot status."""

    def __init__(self, ids: DeviceIds) -> None:
        self.ids = ids
        self.codes: list[int] = []
        self.dropped = False
        self.network = 0
        self.procs = 0
        self.boot = 16
        self.resets = 0
        self.link_up = True


class SimSwitch:
    """Simulated lingqu switch faults (same calls as :class:`faultmesh.dcmi.lingqu.Lingqu`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.faults: list[SwitchEvent] = []
        self._cb: Callable[[SwitchEvent], None] | None = None
        self._serial = 0

    def init(self) -> None:
        pass

    def subscribe(self, cb: Callable[[SwitchEvent], None]) -> None:
        self._cb = cb

    def fault_info(self) -> list[SwitchEvent]:
        with self._lock:
            return list(self.faults)

    def fire(
        self,
        event_type: int,
        fault_id: int,
        peer: int,
        peer_port: int,
        chip: int,
        port: int,
        severity: int,
        assertion: int,
    ) -> None:
        """Update the current list and deliver the event from another thread (like the C library)."""
        with self._lock:
            self._serial += 1
            ev = SwitchEvent(
                event_type, fault_id, peer, peer_port, chip, port, severity, assertion, self._serial, 0, 0
            )
            same = [f for f in self.faults if f[:6] == ev[:6]]
            if assertion == 1 and not same:
                self.faults.append(ev)
            if assertion == 0:
                self.faults = [f for f in self.faults if f[:6] != ev[:6]]
            cb = self._cb
        if cb is not None:
            t = threading.Thread(target=cb, args=(ev,), name="sim-lingqu-cb", daemon=True)
            t.start()
            t.join(5)


class SimBackend:
    """A pure-Python node of ``cards`` × ``per_card`` chips (logic = card*per_card + dev, phy = logic).

    ``wide_codes`` (``--sim-vendor nvidia``): a simulated GPU node, whose codes are the NVIDIA table's
    48-bit XID / NVML codes (e.g. 4E560000004F = XID 79). Driven by :mod:`deviced.simapi` (HTTP) or directly: :meth:`inject`, :meth:`link`, :meth:`probe`,
    :meth:`card`, :meth:`set_procs`. Events are delivered to the subscriber from a separate thread, like
    the driver's callbacks.
    """

    name = "sim"

    def __init__(
        self,
        cards: int = 1,
        per_card: int = 8,
        chip: str = "910B3",
        reset_boot_s: float = 0.2,
        wide_codes: bool = False,
    ):
        self._lock = threading.Lock()
        self.chip = chip
        self.wide_codes = wide_codes  # codes over 32 bits (the NVIDIA table's XID / NVML codes)
        self.reset_boot_s = reset_boot_s
        self.devs = {
            c * per_card + d: SimDevice(DeviceIds(c * per_card + d, c * per_card + d, c, d))
            for c in range(cards)
            for d in range(per_card)
        }
        self._cb: Callable[[DevFaultEvent], None] | None = None
        self._serial = 0
        self.switch = SimSwitch()
        self.super_pod = (-1, -1)  # (super_pod_id, server_index): set e.g. (0, 3) for an A3 super pod

    # ---- backend calls
    def init(self) -> None:
        pass

    def devices(self) -> list[DeviceIds]:
        return [d.ids for d in self.devs.values()]

    def _dev(self, ids: DeviceIds) -> SimDevice:
        return self.devs[ids.logic]

    def health(self, ids: DeviceIds) -> int:
        d = self._dev(ids)
        if d.dropped:
            raise DeviceNotReady(-8012, "dcmi_get_device_health")
        return 1 if d.codes else 0

    def error_codes(self, ids: DeviceIds) -> list[int]:
        with self._lock:
            return list(self._dev(ids).codes)

    def subscribe(self, cb: Callable[[DevFaultEvent], None]) -> None:
        self._cb = cb

    def network_health(self, ids: DeviceIds) -> int:
        return self._dev(ids).network

    def process_count(self, ids: DeviceIds) -> int:
        return self._dev(ids).procs

    def boot_status(self, ids: DeviceIds) -> int:
        return self._dev(ids).boot

    def reset(self, ids: DeviceIds) -> None:
        d = self._dev(ids)
        with self._lock:
            d.resets += 1
            d.codes.clear()
            d.boot = 0

        def boot() -> None:
            time.sleep(self.reset_boot_s)
            d.boot = 16

        threading.Thread(target=boot, daemon=True).start()

    def spod(self, ids: DeviceIds) -> tuple[int, int]:
        return self.super_pod

    def link_up(self, ids: DeviceIds) -> bool | None:
        return self._dev(ids).link_up

    def chip_name(self, ids: DeviceIds) -> str:
        return self.chip

    # ---- control
    def inject(self, logic: int, code: int, assertion: int = 1, severity: int = 2) -> None:
        """Apply an event to the chip's live list and deliver it to the subscriber (another thread).
        Raises ``KeyError`` for an unknown chip."""
        d = self.devs[logic]
        with self._lock:
            if assertion == 1 and code not in d.codes:
                d.codes.append(code)
            elif assertion == 0 and code in d.codes:
                d.codes.remove(code)
            self._serial += 1
            ev = DevFaultEvent(
                code, logic, 0, 0, 0, 0, severity, assertion, self._serial, 0, int(time.time()), "sim event"
            )
            cb = self._cb
        if cb is not None:
            t = threading.Thread(target=cb, args=(ev,), name="sim-dcmi-cb", daemon=True)
            t.start()
            t.join(5)

    def link(self, logic: int, up: bool) -> None:
        """Link down (81078603 occur) or up (recover); ``hccn_tool`` shows the same state."""
        self.devs[logic].link_up = up
        self.inject(logic, 0x81078603, 0 if up else 1, 2)

    def link_silent(self, logic: int, up: bool) -> None:
        """Change the link state without any event (a lost linkdown event): only hccn_tool sees it."""
        self.devs[logic].link_up = up

    def probe(self, logic: int, result: int) -> None:
        """Set the gateway-probe result (0 OK, 6 INIT healthy; 1..5, 7, 8 abnormal)."""
        self.devs[logic].network = result

    def card(self, logic: int, dropped: bool) -> None:
        """Card drop: health returns -8012 until ``dropped`` is False."""
        self.devs[logic].dropped = dropped

    def set_procs(self, logic: int, n: int) -> None:
        """Processes on the chip (0 = idle, a hot-reset gate)."""
        self.devs[logic].procs = n

    def state(self) -> list[dict]:
        """The simulated chips as JSON-able dicts."""
        with self._lock:
            return [
                {
                    "logic_id": d.ids.logic,
                    "phy_id": d.ids.phy,
                    "codes": [f"{c:08X}" for c in d.codes],
                    "dropped": d.dropped,
                    "network": d.network,
                    "procs": d.procs,
                    "boot": d.boot,
                    "resets": d.resets,
                }
                for d in self.devs.values()
            ]
