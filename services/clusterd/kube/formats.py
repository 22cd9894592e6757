"""The reference's ConfigMap formats, read and written (pure functions, no I/O).

Inputs (reference clusterd.md §6.1, noded.md §4, deviced.md §5.1):

- ``mindx-dl-nodeinfo-<node>`` key ``NodeInfo`` = ``{"NodeInfo": FaultDevInfo, "CheckCode": hex}``
  plus ``updateTime`` (RFC3339), written by the reference NodeD;
- ``mindx-dl-deviceinfo-<node>`` key ``DeviceInfoCfg`` = ``{"DeviceInfo": {DeviceList, UpdateTime},
  "SuperPodID", "ServerIndex", "CheckCode", "RackID"?}`` and optional ``SwitchInfoCfg``, written by
  the reference device plugin;
- public-fault ConfigMaps: key ``PublicFault`` = the SendPublicFault request in lowerCamel JSON.

Outputs (clusterd.md §6.5), each ConfigMap holding one data key equal to its name:

- ``cluster-info-device-<i>``: ``{"mindx-dl-deviceinfo-<node>": {DeviceList, UpdateTime, CmName,
  SuperPodID, RackID, ServerIndex}}``, faults of one NPU merged per fault_type (codes comma-joined,
  the most severe level);
- ``cluster-info-switch-<i>``: ``{"mindx-dl-switchinfo-<node>": {FaultCode, FaultLevel, UpdateTime,
  NodeStatus, FaultTimeAndLevelMap, CmName}}``;
- ``cluster-info-node-cm`` (never sharded): ``{"mindx-dl-nodeinfo-<node>": {FaultDevList, NodeStatus,
  CmName, UpdateTime}}``; an empty map is written as ``""``.

Sharding differs from the reference on purpose: entries are packed in node-name order into shards of
at most ``max_bytes`` (800 KiB by default), so the same cluster state always gives the same shards
(the reference splits in Go's random map order).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from faultmesh import gojson
from faultmesh.levels import level_severity
from faultmesh.model import Fault

NODEINFO_PREFIX = "mindx-dl-nodeinfo-"
DEVICEINFO_PREFIX = "mindx-dl-deviceinfo-"
SWITCHINFO_PREFIX = "mindx-dl-switchinfo-"
DEVICE_CM_PREFIX = "cluster-info-device-"
SWITCH_CM_PREFIX = "cluster-info-switch-"
NODE_CM_NAME = "cluster-info-node-cm"
RESOURCE_PREFIX = "huawei.com/"
MAX_SHARD_BYTES = 800 * 1024

SOURCE_NODEINFO = "kube:nodeinfo"
SOURCE_DEVICEINFO = "kube:deviceinfo"

# Levels that keep an NPU available (clusterd.md §5 "Merge into cluster-info").
AVAILABLE_LEVELS = frozenset({"NotHandleFault", "SubHealthFault", "NormalNPU", "NormalNetwork"})
# Switch level -> NodeStatus (clusterd.md §6.5).
SWITCH_STATUS = {
    "NotHandleFault": "Healthy",
    "SubHealthFault": "SubHealthy",
    "RestartRequest": "UnHealthy",
    "PreSeparateFault": "PreSeparate",
    "PreSeparateNPU": "PreSeparate",
    "SeparateFault": "UnHealthy",
    "SeparateNPU": "UnHealthy",
}


class BadConfigMap(ValueError):
    """A ConfigMap that cannot be used. ``reason`` is a short counter label
    (missing_key, bad_json, bad_checkcode, bad_name)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# -- inputs ---------------------------------------------------------------------------------------
@dataclass
class NodeInfoDoc:
    """A verified ``mindx-dl-nodeinfo-<node>``: ``info`` in Go field order, ``update_ms`` (ms or None)."""

    info: dict
    update_ms: int | None


@dataclass
class DeviceInfoDoc:
    """A verified ``mindx-dl-deviceinfo-<node>``."""

    device_list: dict[str, str]
    update_time: int  # unix s
    super_pod_id: int = -2
    server_index: int = -2
    rack_id: int | None = None
    switch_info: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise BadConfigMap("bad_json", f"{what}: {e}") from None


def parse_time_ms(text: str | None) -> int | None:
    """RFC3339 (``2026-01-02T03:04:05+08:00``) -> ms since the epoch; None when absent or bad."""
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    return int(dt.timestamp() * 1000)


def parse_node_info(data: dict[str, str] | None) -> NodeInfoDoc:
    """Verify and read a node-info ConfigMap's ``data``. Raises :class:`BadConfigMap`."""
    data = data or {}
    if "NodeInfo" not in data:
        raise BadConfigMap("missing_key", "no NodeInfo key")
    doc = _loads(data["NodeInfo"], "NodeInfo")
    if not isinstance(doc, dict) or not isinstance(doc.get("CheckCode"), str):
        raise BadConfigMap("bad_json", "NodeInfo must be an object with a CheckCode string")
    try:
        info = gojson.canon_node_info(doc.get("NodeInfo"))
    except gojson.GoTypeError as e:
        raise BadConfigMap("bad_json", str(e)) from None
    if gojson.check_code(info) != doc["CheckCode"]:
        raise BadConfigMap("bad_checkcode", "CheckCode does not match NodeInfo")
    return NodeInfoDoc(info=info, update_ms=parse_time_ms(data.get("updateTime")))


def parse_device_info(data: dict[str, str] | None) -> DeviceInfoDoc:
    """Verify and read a device-info ConfigMap's ``data``. Raises :class:`BadConfigMap`.

    A bad ``SwitchInfoCfg`` does not reject the device part: ``switch_info`` is then None.
    """
    data = data or {}
    if "DeviceInfoCfg" not in data:
        raise BadConfigMap("missing_key", "no DeviceInfoCfg key")
    doc = _loads(data["DeviceInfoCfg"], "DeviceInfoCfg")
    if not isinstance(doc, dict) or not isinstance(doc.get("CheckCode"), str):
        raise BadConfigMap("bad_json", "DeviceInfoCfg must be an object with a CheckCode string")
    try:
        info = gojson.canon_device_info(doc.get("DeviceInfo"))
        spid = gojson._int(doc.get("SuperPodID", -2), "SuperPodID")
        sidx = gojson._int(doc.get("ServerIndex", -2), "ServerIndex")
        rack = gojson._int(doc["RackID"], "RackID") if doc.get("RackID") is not None else None
    except gojson.GoTypeError as e:
        raise BadConfigMap("bad_json", str(e)) from None
    if gojson.check_code(info) != doc["CheckCode"]:
        raise BadConfigMap("bad_checkcode", "CheckCode does not match DeviceInfo")
    switch = None
    if data.get("SwitchInfoCfg"):
        try:
            switch = json.loads(data["SwitchInfoCfg"])
        except ValueError:
            switch = None
        if not isinstance(switch, dict) or not switch:
            switch = None
    return DeviceInfoDoc(
        device_list=info["DeviceList"] or {},
        update_time=info["UpdateTime"],
        super_pod_id=spid,
        server_index=sidx,
        rack_id=rack,
        switch_info=switch,
    )


def device_index(npu_name: str) -> int:
    """``Ascend910-3`` -> 3. Raises :class:`BadConfigMap`."""
    _, _, tail = npu_name.rpartition("-")
    if not tail.isdigit():
        raise BadConfigMap("bad_json", f"npu_name {npu_name!r} has no device index")
    return int(tail)


def faults_from_device_info(node: str, doc: DeviceInfoDoc) -> list[Fault]:
    """The device faults of a device-info ConfigMap as fault records (source ``kube:deviceinfo``).

    Each ``<P>-Fault`` entry is split into one record per code; a code's level comes from
    ``fault_time_and_level_map`` or else the entry's ``fault_level``; an empty code with level
    ManuallySeparateNPU becomes code ``ManuallySeparateNPU`` (clusterd.md §6.1). ``PublicFault``
    entries are skipped: they are ClusterD's own output, not the device plugin's.
    """
    out: dict[tuple, Fault] = {}
    for key, value in sorted(doc.device_list.items()):
        if not (key.startswith(RESOURCE_PREFIX) and key.endswith("-Fault")):
            continue
        entries = _loads(value, key) if value else []
        if not isinstance(entries, list):
            raise BadConfigMap("bad_json", f"{key} must be a JSON array")
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("npu_name"), str):
                raise BadConfigMap("bad_json", f"{key}: fault entry without npu_name")
            ftype = str(e.get("fault_type") or "CardUnhealthy")
            if ftype == "PublicFault":
                continue
            dev = device_index(e["npu_name"])
            tl = e.get("fault_time_and_level_map") or {}
            if not isinstance(tl, dict):
                raise BadConfigMap("bad_json", f"{key}: fault_time_and_level_map must be an object")
            level0 = str(e.get("fault_level") or e.get("large_model_fault_level") or "NotHandleFault")
            codes = [c.strip() for c in str(e.get("fault_code") or "").split(",") if c.strip()]
            if not codes and level0 == "ManuallySeparateNPU":
                codes = ["ManuallySeparateNPU"]
            for code in codes:
                per = tl.get(code) if isinstance(tl.get(code), dict) else {}
                level = str(per.get("fault_level") or level0)
                t = per.get("fault_time")
                t_ms = int(t) if isinstance(t, int) and not isinstance(t, bool) and t > 0 else 0
                f = Fault(
                    source=SOURCE_DEVICEINFO,
                    node=node,
                    device_type="NPU",
                    device_id=dev,
                    code=code.upper() if code != "ManuallySeparateNPU" else code,
                    level=level,
                    first_seen_ms=t_ms,
                    last_seen_ms=t_ms,
                    attributes={"fault_type": ftype, "npu_name": e["npu_name"]},
                )
                old = out.get(f.key)
                if old is None or level_severity(f.level) > level_severity(old.level):
                    out[f.key] = f
    return list(out.values())


def faults_from_node_info(node: str, doc: NodeInfoDoc, now_ms: int) -> list[Fault]:
    """Node faults of a node-info ConfigMap (source ``kube:nodeinfo``); fault time = ``updateTime``."""
    t = doc.update_ms or now_ms
    out: dict[tuple, Fault] = {}
    for dev in doc.info["FaultDevList"] or ():
        for code in dev["FaultCode"] or ():
            if not code:
                continue
            f = Fault(
                source=SOURCE_NODEINFO,
                node=node,
                device_type=dev["DeviceType"] or "Node",
                device_id=dev["DeviceId"],
                code=code.upper(),
                level=dev["FaultLevel"] or "NotHandleFault",
                first_seen_ms=t,
                last_seen_ms=t,
            )
            out[f.key] = f
    return list(out.values())


def node_name_of(cm_name: str, prefix: str) -> str | None:
    """``mindx-dl-nodeinfo-node-1`` -> ``node-1`` (None when the prefix does not match)."""
    if not cm_name.startswith(prefix) or len(cm_name) == len(prefix):
        return None
    return cm_name[len(prefix) :]
