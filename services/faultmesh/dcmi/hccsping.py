"""hccsping (HCCS pingmesh) over DCMI: struct layouts, parameter checks, and the backend noded uses.

Source: reference noded.md §6 "Task control" and the DCMI API pages of ``dcmi_start_hccsping_mesh`` /
``dcmi_get_hccsping_mesh_info``: ``struct dcmi_hccsping_mesh_operate {char dst_addr_list[1024];
int pkt_size, pkt_send_num, pkt_interval, timeout, task_interval, task_id}`` and ``struct
dcmi_hccsping_mesh_info {char dst_addr[48][16]; unsigned suc_pkt_num[48], fail_pkt_num[48];
long max_time[48], min_time[48], avg_time[48], tp95_time[48]; int reply_stat_num[48];
unsigned long long ping_total_num[48]; int dest_num}``. Port id is always 0, task id 0 or 1;
validated ranges pkt_size 1792..3000, pkt_send_num 1..1000, pkt_interval 0..1000 ms,
task_interval 1..60 s. Delays of -1 mean the destination did not answer.

Two backends implement :class:`HccspingBackend` (blocking calls; noded runs them through its
BlockingPool): :class:`DcmiHccsping` (ctypes on ``libdcmi.so``, via :class:`faultmesh.dcmi.api.Dcmi`)
and ``noded.pingmesh.simbackend.SimHccsping`` (pure Python, on the fabric simulator).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Protocol

from faultmesh.dcmi.loader import Library, NotSupported, SymbolMissing

IP_ADDR_LIST_LEN = 1024
HCCS_PING_MESH_MAX_NUM = 48
ADDR_MAX_LEN = 16
PORT_ID = 0
TASK_IDS = (0, 1)
PKT_SIZE_RANGE = (1792, 3000)
PKT_SEND_NUM_RANGE = (1, 1000)
PKT_INTERVAL_RANGE = (0, 1000)
TASK_INTERVAL_RANGE = (1, 60)
STATE_STOPPED = 0
STATE_RUNNING = 1

c_int, c_uint, c_long = ctypes.c_int, ctypes.c_uint, ctypes.c_long


class HccspingMeshOperate(ctypes.Structure):
    """``struct dcmi_hccsping_mesh_operate`` (1048 bytes)."""

    _fields_ = [
        ("dst_addr_list", ctypes.c_char * IP_ADDR_LIST_LEN),
        ("pkt_size", c_int),
        ("pkt_send_num", c_int),
        ("pkt_interval", c_int),
        ("timeout", c_int),
        ("task_interval", c_int),
        ("task_id", c_int),
    ]


class HccspingMeshInfo(ctypes.Structure):
    """``struct dcmi_hccsping_mesh_info`` (LP64: 3272 bytes)."""

    _fields_ = [
        ("dst_addr", (ctypes.c_char * ADDR_MAX_LEN) * HCCS_PING_MESH_MAX_NUM),
        ("suc_pkt_num", c_uint * HCCS_PING_MESH_MAX_NUM),
        ("fail_pkt_num", c_uint * HCCS_PING_MESH_MAX_NUM),
        ("max_time", c_long * HCCS_PING_MESH_MAX_NUM),
        ("min_time", c_long * HCCS_PING_MESH_MAX_NUM),
        ("avg_time", c_long * HCCS_PING_MESH_MAX_NUM),
        ("tp95_time", c_long * HCCS_PING_MESH_MAX_NUM),
        ("reply_stat_num", c_int * HCCS_PING_MESH_MAX_NUM),
        ("ping_total_num", ctypes.c_ulonglong * HCCS_PING_MESH_MAX_NUM),
        ("dest_num", c_int),
    ]


class HccspingParamError(ValueError):
    """A task parameter outside the driver's documented range (the message names it)."""


@dataclass(frozen=True)
class PingOp:
    """Task parameters (units: bytes, packets, ms, s). Defaults are NodeD's (noded.md §6)."""

    dst_addrs: tuple[str, ...]
    task_id: int = 0
    pkt_size: int = 1792
    pkt_send_num: int = 10
    pkt_interval: int = 10
    timeout: int = 1
    task_interval: int = 1

    def validate(self) -> None:
        """Raise :class:`HccspingParamError` when a value is outside the documented ranges, there
        are no or more than 48 destinations, or the comma list exceeds 1023 bytes."""
        for name, (lo, hi) in (
            ("pkt_size", PKT_SIZE_RANGE),
            ("pkt_send_num", PKT_SEND_NUM_RANGE),
            ("pkt_interval", PKT_INTERVAL_RANGE),
            ("task_interval", TASK_INTERVAL_RANGE),
        ):
            v = getattr(self, name)
            if not lo <= v <= hi:
                raise HccspingParamError(f"{name} {v} outside {lo}..{hi}")
        if self.task_id not in TASK_IDS:
            raise HccspingParamError(f"task_id {self.task_id} not in {TASK_IDS}")
        if self.timeout < 0:
            raise HccspingParamError("timeout must be >= 0")
        if not self.dst_addrs or len(self.dst_addrs) > HCCS_PING_MESH_MAX_NUM:
            raise HccspingParamError(f"{len(self.dst_addrs)} destinations (1..{HCCS_PING_MESH_MAX_NUM})")
        if any(not a or "," in a or len(a) >= ADDR_MAX_LEN for a in self.dst_addrs):
            raise HccspingParamError("bad destination address")
        if len(self.addr_list().encode()) >= IP_ADDR_LIST_LEN:
            raise HccspingParamError("destination list longer than 1023 bytes")

    def addr_list(self) -> str:
        """The comma-joined destination list the driver takes."""
        return ",".join(self.dst_addrs)


@dataclass
class DestStat:
    """Statistics of one destination since the previous query (delays in the driver's unit, -1 =
    no answer): ``suc``/``fail`` packets, ``reply_stat_num`` rounds in this sample,
    ``ping_total_num`` rounds since the task started."""

    addr: str
    suc: int
    fail: int
    max_time: int
    min_time: int
    avg_time: int
    tp95_time: int
    reply_stat_num: int
    ping_total_num: int


@dataclass
class HccspingInfo:
    """The result of one ``get_hccsping_mesh_info``: ``dests`` (at most 48)."""

    dests: list[DestStat] = field(default_factory=list)

    @property
    def dest_num(self) -> int:
        """Number of destinations."""
        return len(self.dests)


@dataclass(frozen=True)
class ChipInfo:
    """One chip of this node: ``phy_id``, DCMI ``card``/``device``, and its super-pod info
    (``sdid``, ``super_pod_id``, ``server_index``; -1 when unknown)."""

    phy_id: int
    card: int
    device: int
    sdid: int
    super_pod_id: int
    server_index: int


class HccspingBackend(Protocol):
    """What noded's pingmesh needs from the driver. Every call blocks; errors are DcmiError types
    (``NotSupported`` disables pingmesh)."""

    def chips(self) -> list[ChipInfo]: ...

    def start(self, phy_id: int, op: PingOp) -> None: ...

    def stop(self, phy_id: int, task_id: int) -> None: ...

    def state(self, phy_id: int, task_id: int) -> int: ...

    def info(self, phy_id: int, task_id: int) -> HccspingInfo: ...


def decode_info(raw: HccspingMeshInfo) -> HccspingInfo:
    """Copy a C ``dcmi_hccsping_mesh_info`` into :class:`HccspingInfo`. Raises ``ValueError`` when
    ``dest_num`` is outside 0..48 (the reference rejects > 48)."""
    n = raw.dest_num
    if not 0 <= n <= HCCS_PING_MESH_MAX_NUM:
        raise ValueError(f"dest_num {n} outside 0..{HCCS_PING_MESH_MAX_NUM}")
    return HccspingInfo(
        [
            DestStat(
                bytes(raw.dst_addr[i]).split(b"\0", 1)[0].decode("ascii", "replace"),
                raw.suc_pkt_num[i],
                raw.fail_pkt_num[i],
                raw.max_time[i],
                raw.min_time[i],
                raw.avg_time[i],
                raw.tp95_time[i],
                raw.reply_stat_num[i],
                raw.ping_total_num[i],
            )
            for i in range(n)
        ]
    )


class DcmiHccsping:
    """:class:`HccspingBackend` over ``libdcmi.so``: chips from :class:`faultmesh.dcmi.api.Dcmi`
    (cards × devices, physical ids, ``dcmi_get_device_info`` SPOD_INFO), tasks through the four
    hccsping calls. ``DcmiHccsping.open(path)`` loads the library and runs ``dcmi_init``."""

    def __init__(self, dcmi) -> None:
        self.dcmi = dcmi
        lib: Library = dcmi.lib
        P = ctypes.POINTER
        self._start = lib.function("dcmi_start_hccsping_mesh", c_int, c_int, c_int, P(HccspingMeshOperate))
        self._stop = lib.function("dcmi_stop_hccsping_mesh", c_int, c_int, c_int, c_uint)
        self._state = lib.function("dcmi_get_hccsping_mesh_state", c_int, c_int, c_int, c_uint, P(c_uint))
        self._info = lib.function(
            "dcmi_get_hccsping_mesh_info", c_int, c_int, c_int, c_uint, P(HccspingMeshInfo)
        )
        self._ids: dict[int, tuple[int, int]] = {}

    @classmethod
    def open(cls, path: str | None = None) -> DcmiHccsping:
        """Load and init DCMI (raises ``LibraryMissing``/``DcmiError``)."""
        from faultmesh.dcmi.api import Dcmi

        d = Dcmi.open(path)
        d.init()
        return cls(d)

    def supported(self) -> bool:
        """The reference's start-up probe: state of task 0 on the first chip; -8255 (not supported)
        or a missing symbol -> False; other errors only mean "try later" (True)."""
        chips = self.dcmi.devices()
        if not chips:
            return False
        try:
            self._state_of(chips[0].card, chips[0].device, 0)
        except (NotSupported, SymbolMissing):
            return False
        except Exception:
            return True
        return True

    def chips(self) -> list[ChipInfo]:
        """Every chip with its super-pod info (0xffffffff -> -1), sorted by physical id."""
        out = []
        for d in self.dcmi.devices():
            info = self.dcmi.spod_info(d.card, d.device)

            def v(x: int) -> int:
                return -1 if x == 0xFFFFFFFF else int(x)

            out.append(
                ChipInfo(d.phy, d.card, d.device, v(info.sdid), v(info.super_pod_id), v(info.server_id))
            )
            self._ids[d.phy] = (d.card, d.device)
        return sorted(out, key=lambda c: c.phy_id)

    def _cd(self, phy_id: int) -> tuple[int, int]:
        if phy_id not in self._ids:
            self.chips()
        try:
            return self._ids[phy_id]
        except KeyError:
            raise ValueError(f"no chip with physical id {phy_id}") from None

    def start(self, phy_id: int, op: PingOp) -> None:
        """``dcmi_start_hccsping_mesh`` (validates ``op`` first: :class:`HccspingParamError`)."""
        op.validate()
        card, dev = self._cd(phy_id)
        c = HccspingMeshOperate()
        c.dst_addr_list = op.addr_list().encode()
        c.pkt_size, c.pkt_send_num, c.pkt_interval = op.pkt_size, op.pkt_send_num, op.pkt_interval
        c.timeout, c.task_interval, c.task_id = op.timeout, op.task_interval, op.task_id
        self._start(card, dev, PORT_ID, ctypes.byref(c))

    def stop(self, phy_id: int, task_id: int) -> None:
        """``dcmi_stop_hccsping_mesh``."""
        card, dev = self._cd(phy_id)
        self._stop(card, dev, PORT_ID, task_id)

    def _state_of(self, card: int, dev: int, task_id: int) -> int:
        out = c_uint(0)
        self._state(card, dev, PORT_ID, task_id, ctypes.byref(out))
        return out.value

    def state(self, phy_id: int, task_id: int) -> int:
        """``dcmi_get_hccsping_mesh_state``: 0 stopped, otherwise running."""
        card, dev = self._cd(phy_id)
        return self._state_of(card, dev, task_id)

    def info(self, phy_id: int, task_id: int) -> HccspingInfo:
        """``dcmi_get_hccsping_mesh_info`` decoded (``ValueError`` for dest_num > 48)."""
        card, dev = self._cd(phy_id)
        raw = HccspingMeshInfo()
        self._info(card, dev, PORT_ID, task_id, ctypes.byref(raw))
        return decode_info(raw)
