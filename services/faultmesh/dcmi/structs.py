"""C struct layouts and callback types of the DCMI and lingqu calls deviced uses, declared once.

Source: reference deviced.md §1 (``dcmi_event``, ``dcmi_dms_fault_event``, ``dcmi_event_filter``,
``dcmi_spod_info``, ``enum dcmi_rdfx_detect_result``, lingqu ``LqDcmiEvent``). Layouts follow the
x86_64/aarch64 LP64 ABI (``unsigned long`` = 8 bytes). ``tests/deviced/test_dcmi_structs.py`` checks
every size and field offset against the C compiler (``tests/native/dcmi_test_lib.c``).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum

DCMI_MAX_EVENT_NAME_LENGTH = 256
DCMI_MAX_EVENT_DATA_LENGTH = 32
DCMI_MAX_EVENT_RESV_LENGTH = 32
ERROR_CODE_LIST_LEN = 128  # dcmi_get_device_errorcode_v2 list length used by the reference
CARD_LIST_LEN = 64
MAX_PROC_NUM = 32

DCMI_DMS_FAULT_EVENT = 0  # enum dcmi_event_type


class DcmiDmsFaultEvent(ctypes.Structure):
    """``struct dcmi_dms_fault_event`` (352 bytes): one chip fault event from the subscription."""

    _fields_ = [
        ("event_id", ctypes.c_uint32),
        ("deviceid", ctypes.c_uint16),
        ("node_type", ctypes.c_uint8),
        ("node_id", ctypes.c_uint8),
        ("sub_node_type", ctypes.c_uint8),
        ("sub_node_id", ctypes.c_uint8),
        ("severity", ctypes.c_uint8),
        ("assertion", ctypes.c_uint8),
        ("event_serial_num", ctypes.c_int32),
        ("notify_serial_num", ctypes.c_int32),
        ("alarm_raised_time", ctypes.c_uint64),
        ("event_name", ctypes.c_char * DCMI_MAX_EVENT_NAME_LENGTH),
        ("additional_info", ctypes.c_char * DCMI_MAX_EVENT_DATA_LENGTH),
        ("resv", ctypes.c_uint8 * DCMI_MAX_EVENT_RESV_LENGTH),
    ]


class _DcmiEventUnion(ctypes.Union):
    _fields_ = [("dms_event", DcmiDmsFaultEvent)]


class DcmiEvent(ctypes.Structure):
    """``struct dcmi_event`` (360 bytes): ``type`` (0 = DMS fault event) and ``event_t.dms_event``."""

    _fields_ = [("type", ctypes.c_int), ("event_t", _DcmiEventUnion)]


class DcmiEventFilter(ctypes.Structure):
    """``struct dcmi_event_filter`` (48 bytes, passed by value). All zero = no filtering (reference §1)."""

    _fields_ = [
        ("filter_flag", ctypes.c_uint64),
        ("event_id", ctypes.c_uint32),
        ("severity", ctypes.c_uint8),
        ("node_type", ctypes.c_uint8),
        ("resv", ctypes.c_uint8 * DCMI_MAX_EVENT_RESV_LENGTH),
    ]


class DcmiSpodInfo(ctypes.Structure):
    """``struct dcmi_spod_info`` (48 bytes): super-pod id, server id... (``dcmi_get_device_info`` 12/1)."""

    _fields_ = [
        ("sdid", ctypes.c_uint32),
        ("scale_type", ctypes.c_uint32),
        ("super_pod_id", ctypes.c_uint32),
        ("server_id", ctypes.c_uint32),
        ("chassis_id", ctypes.c_uint32),
        ("super_pod_type", ctypes.c_uint32),
        ("reserve", ctypes.c_uint32 * 6),
    ]


class DcmiProcMemInfo(ctypes.Structure):
    """``struct dcmi_proc_mem_info`` (16 bytes): one process using the chip (pid, bytes of memory)."""

    _fields_ = [("proc_id", ctypes.c_int), ("proc_mem_usage", ctypes.c_ulong)]


class DcmiChipInfo(ctypes.Structure):
    """``struct dcmi_chip_info`` (100 bytes): chip type, name (e.g. ``910B3``), version, AI core count."""

    _fields_ = [
        ("chip_type", ctypes.c_char * 32),
        ("chip_name", ctypes.c_char * 32),
        ("chip_ver", ctypes.c_char * 32),
        ("aicore_cnt", ctypes.c_uint32),
    ]


DcmiFaultEventCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(DcmiEvent))
"""``void (*)(struct dcmi_event *)``: called on a driver (C) thread."""


class RdfxDetectResult(IntEnum):
    """``enum dcmi_rdfx_detect_result``: gateway-probe result. Healthy means OK or INIT (reference §1)."""

    OK = 0
    SOCK_FAIL = 1
    RECV_TIMEOUT = 2
    UNREACH = 3
    TIME_EXCEEDED = 4
    FAULT = 5
    INIT = 6
    THREAD_ERR = 7
    IP_SET = 8
    MAX = 0xFF


def network_probe_healthy(result: int) -> bool:
    """True when a gateway-probe result counts as healthy (OK=0 or INIT=6)."""
    return result in (RdfxDetectResult.OK, RdfxDetectResult.INIT)


# Main command / sub command of dcmi_get_device_info for the super-pod info (reference §1).
DCMI_MAIN_CMD_CHIP_INF = 12
DCMI_CHIP_INF_SUB_CMD_SPOD_INFO = 1
BOOT_START_FINISH = 16  # dcmi_get_device_boot_status value the reference waits for (§1 ⚠)
INBAND_CHANNEL = 1
OUTBAND_CHANNEL = 0


# ---- lingqu (switch) ------------------------------------------------------------------------------


class LqDcmiEvent(ctypes.Structure):
    """``LqDcmiEvent`` (112 bytes): one switch fault (reference §1 and §7)."""

    _fields_ = [
        ("eventType", ctypes.c_int),  # HalReportFaultType 0..19, the "alarm id"
        ("subType", ctypes.c_uint32),  # fault id; 0xFFFFFFFF = na
        ("peerportDevice", ctypes.c_uint16),
        ("peerportId", ctypes.c_uint16),
        ("switchChipid", ctypes.c_uint16),
        ("switchPortid", ctypes.c_uint16),
        ("severity", ctypes.c_uint8),
        ("assertion", ctypes.c_uint8),
        ("res", ctypes.c_char * 6),
        ("eventSerialNum", ctypes.c_uint32),
        ("notifySerialNum", ctypes.c_uint32),
        ("alarmRaisedTime", ctypes.c_ulong),
        ("additionalParam", ctypes.c_uint8 * 40),
        ("additionalInfo", ctypes.c_char * 32),
    ]


class LqDcmiEventFilter(ctypes.Structure):
    """``struct lq_dcmi_event_filter`` (20 bytes, by value); zeroed = no filtering."""

    _fields_ = [
        ("filterFlag", ctypes.c_int),
        ("eventTypeId", ctypes.c_int),
        ("eventId", ctypes.c_uint32),
        ("severity", ctypes.c_uint8),
        ("chipId", ctypes.c_uint32),
    ]


LqFaultEventCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(LqDcmiEvent))
"""``void (*)(struct LqDcmiEvent *)``: called on a lingqu (C) thread."""

LINGQU_LIST_LEN = 128

# (struct name in C, ctypes class) pairs the size test walks.
CHECKED_STRUCTS = {
    "dcmi_dms_fault_event": DcmiDmsFaultEvent,
    "dcmi_event": DcmiEvent,
    "dcmi_event_filter": DcmiEventFilter,
    "dcmi_spod_info": DcmiSpodInfo,
    "dcmi_proc_mem_info": DcmiProcMemInfo,
    "dcmi_chip_info": DcmiChipInfo,
    "LqDcmiEvent": LqDcmiEvent,
    "lq_dcmi_event_filter": LqDcmiEventFilter,
}
