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
from faultmesh.levels import NODE_STATUS_BY_LEVEL, NodeLevel, level_severity
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


def _device_index(npu_name: str) -> int:
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
            dev = _device_index(e["npu_name"])
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


# -- outputs --------------------------------------------------------------------------------------
def _worst(levels) -> str:
    levels = list(levels)
    return max(levels, key=level_severity) if levels else "NotHandleFault"


def _node_level(level: str) -> str:
    """Any level name -> the node level NodeD uses (NotHandleFault / PreSeparateFault / SeparateFault)."""
    if level in NodeLevel.__members__:
        return level
    sev = level_severity(level)
    if sev >= level_severity("SeparateNPU"):
        return "SeparateFault"
    if sev >= level_severity("PreSeparateNPU"):
        return "PreSeparateFault"
    return "NotHandleFault"


def device_fault_entries(npu_name: str, faults: list[Fault]) -> list[dict]:
    """Faults of one NPU merged per fault_type into the reference's DeviceFault objects."""
    by_type: dict[str, list[Fault]] = {}
    for f in faults:
        ftype = f.attributes.get("fault_type") or (
            "PublicFault" if f.source.startswith("public:") else "CardUnhealthy"
        )
        by_type.setdefault(ftype, []).append(f)
    out = []
    for ftype in sorted(by_type):
        fs = sorted(by_type[ftype], key=lambda f: f.code)
        level = _worst(f.level for f in fs)
        codes = [f.code for f in fs if f.code != "ManuallySeparateNPU"]
        tl = {}
        for f in fs:
            if f.code == "ManuallySeparateNPU":
                continue
            t = f.first_seen_ms
            if f.source.startswith("public:"):
                t //= 1000  # public-fault times are seconds inside cluster-info (clusterd.md §11)
            tl[f.code] = {"fault_time": t, "fault_level": f.level}
        out.append(
            {
                "fault_type": ftype,
                "npu_name": npu_name,
                "large_model_fault_level": level,
                "fault_level": level,
                "fault_handling": level,
                "fault_code": ",".join(codes),
                "fault_time_and_level_map": {k: tl[k] for k in sorted(tl)},
            }
        )
    return out


def _names(ids) -> str:
    return ",".join(ids)


def build_device_entry(
    node: str,
    type_name: str,
    faults: list[Fault],
    devices: list[dict] | None = None,
    base: DeviceInfoDoc | None = None,
) -> dict:
    """One ``mindx-dl-deviceinfo-<node>`` entry of ``cluster-info-device-*`` (UpdateTime left out).

    ``faults``: the node's NPU faults from every source, ``device_id`` = the chip's physical id;
    ``devices``: the faultmesh agent's device states (``device_id`` logic id, ``phy_id``, ``health``,
    ``network_health``, ``super_pod_id``, ``server_index``); names use the physical id
    (``Ascend910-<phy>``); ``base``: a reference device-info ConfigMap read for the node (its lists,
    SuperPodID and ServerIndex are kept and the Fault array rebuilt). Without ``base`` SuperPodID /
    ServerIndex are the agent's (:func:`agent_super_pod`; Volcano skips a node whose SuperPodID < 0
    on A3 super pods); RackID is -2 (faultmesh's agents report none).
    """
    prefix = RESOURCE_PREFIX + type_name
    by_dev: dict[int, list[Fault]] = {}
    for f in faults:  # every source names NPUs by physical id (deviced since its phy-id change)
        by_dev.setdefault(f.device_id, []).append(f)
    name = lambda i: f"{type_name}-{i}"  # noqa: E731
    unhealthy = {d for d, fs in by_dev.items() if any(f.level not in AVAILABLE_LEVELS for f in fs)}
    all_devs: set[int] = set()
    net_unhealthy: set[int] = set()
    recovering: set[int] = set()
    if base is not None:
        for key, val in base.device_list.items():
            if not key.startswith(prefix) or key.endswith("-Fault"):
                continue
            ids = {_device_index(n) for n in val.split(",") if n.strip()}
            all_devs |= ids
            suffix = key[len(prefix) :]
            if suffix == "-Unhealthy":
                unhealthy |= ids
            elif suffix == "-NetworkUnhealthy":
                net_unhealthy |= ids
            elif suffix == "-Recovering":
                recovering |= ids
    for d in devices or ():
        phy = int(d.get("phy_id", d["device_id"]))
        all_devs.add(phy)
        if d.get("health") == "UnHealthy":
            unhealthy.add(phy)
        if d.get("network_health") == "UnHealthy":
            net_unhealthy.add(phy)
    all_devs |= set(by_dev)
    fault_list = []
    for dev in sorted(by_dev):
        fault_list.extend(device_fault_entries(name(dev), by_dev[dev]))
    available = sorted(all_devs - unhealthy - recovering)
    dl = {
        prefix: _names(name(i) for i in available),
        prefix + "-Fault": gojson.marshal(fault_list).decode(),
        prefix + "-NetworkUnhealthy": _names(name(i) for i in sorted(net_unhealthy)),
        prefix + "-Recovering": _names(name(i) for i in sorted(recovering)),
        prefix + "-Unhealthy": _names(name(i) for i in sorted(unhealthy)),
    }
    cm_name = DEVICEINFO_PREFIX + node
    spid, sidx = (base.super_pod_id, base.server_index) if base else agent_super_pod(devices)
    return {
        "DeviceList": {k: dl[k] for k in sorted(dl)},
        "CmName": cm_name,
        "SuperPodID": spid,
        "RackID": base.rack_id if base and base.rack_id is not None else -2,
        "ServerIndex": sidx,
    }


def agent_super_pod(devices: list[dict] | None) -> tuple[int, int]:
    """(SuperPodID, ServerIndex) from deviced's device states: the pair all NPUs report (deviced.md
    §5.1: -1 unset, -2 unsupported or failed); -2, -2 without devices or when they disagree."""
    pairs = {
        (int(d.get("super_pod_id", -2)), int(d.get("server_index", -2)))
        for d in devices or ()
        if d.get("super_pod_id") is not None
    }
    return pairs.pop() if len(pairs) == 1 else (-2, -2)


def build_node_entry(node: str, faults: list[Fault], agent_status: str = "") -> dict:
    """One ``mindx-dl-nodeinfo-<node>`` entry of ``cluster-info-node-cm`` (UpdateTime left out)."""
    groups: dict[tuple[str, int], list[Fault]] = {}
    for f in faults:
        groups.setdefault((f.device_type, f.device_id), []).append(f)
    devs = []
    worst = NodeLevel.NotHandleFault
    for dtype, did in sorted(groups):
        fs = groups[(dtype, did)]
        level = _node_level(_worst(f.level for f in fs))
        worst = max(worst, NodeLevel[level])
        devs.append(
            {
                "DeviceType": dtype,
                "DeviceId": did,
                "FaultCode": sorted({f.code for f in fs}),
                "FaultLevel": level,
            }
        )
    status = NODE_STATUS_BY_LEVEL[worst]
    rank = {"Healthy": 0, "PreSeparate": 1, "UnHealthy": 2}
    if rank.get(agent_status, -1) > rank[status]:
        status = agent_status
    return {"FaultDevList": devs, "NodeStatus": status, "CmName": NODEINFO_PREFIX + node}


def switch_records(f: Fault) -> list[dict]:
    """The reference's SimpleSwitchFaultInfo records of one switch fault (deviced.md §7): the
    ``events`` attribute faultmesh's deviced sends (one record per switch port), else one record made
    from the fault itself (chip = ``device_id``, the first of ``switch_ports``, Assertion 1)."""
    try:
        records = [r for r in json.loads(f.attributes.get("events") or "[]") if isinstance(r, dict)]
    except (TypeError, ValueError):  # not JSON, or not a list
        records = []
    if records:
        return records
    port = (f.attributes.get("switch_ports") or "0").split(",")[0]
    sev = f.attributes.get("severity") or ""
    return [
        {
            "EventType": 0,
            "AssembledFaultCode": f.code,
            "PeerPortDevice": 0,
            "PeerPortId": 0,
            "SwitchChipId": f.device_id,
            "SwitchPortId": int(port) if port.isdigit() else 0,
            "Severity": int(sev) if sev.isdigit() else 0,
            "Assertion": 1,
            "AlarmRaisedTime": f.first_seen_ms,
        }
    ]


def build_switch_entry(node: str, faults: list[Fault], base: dict | None = None) -> dict:
    """One ``mindx-dl-switchinfo-<node>`` entry (UpdateTime left out).

    With a reference ``SwitchInfoCfg`` (``base``) its fields are kept; faultmesh's own switch faults
    are added as the reference's device plugin writes them: each ``FaultCode`` item a JSON record
    (:func:`switch_records`), ``FaultTimeAndLevelMap`` keyed ``<code>_<chip>_<port>``.
    """
    codes = list(base.get("FaultCode") or []) if base else []
    tl = dict(base.get("FaultTimeAndLevelMap") or {}) if base else {}
    levels = [str(base.get("FaultLevel"))] if base and base.get("FaultLevel") else []
    for f in sorted(faults, key=lambda f: (f.device_id, f.code)):
        for r in switch_records(f):
            item = gojson.marshal(r).decode()
            if item not in codes:
                codes.append(item)
            key = f"{r.get('AssembledFaultCode', f.code)}_{r.get('SwitchChipId', f.device_id)}_{r.get('SwitchPortId', 0)}"
            tl[key] = {"fault_time": r.get("AlarmRaisedTime", f.first_seen_ms), "fault_level": f.level}
        levels.append(f.level)
    level = _worst(levels) if levels else "NotHandleFault"
    status = SWITCH_STATUS.get(level) or (
        "UnHealthy" if level_severity(level) >= level_severity("RestartRequest") else "Healthy"
    )
    return {
        "FaultCode": codes,
        "FaultLevel": level,
        "NodeStatus": status,
        "FaultTimeAndLevelMap": {k: tl[k] for k in sorted(tl)},
        "CmName": SWITCHINFO_PREFIX + node,
    }


def entry_part(key: str, entry: dict) -> str:
    """``"key":{...}`` — one member of a cluster-info map, serialized once and cached by the caller."""
    return gojson.marshal({key: entry}).decode()[1:-1]


def shard_parts(parts: list[tuple[str, str]], max_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Pack serialized members ``(key, part)`` into JSON objects of at most ``max_bytes`` bytes each,
    in key order (deterministic). A member larger than ``max_bytes`` gets a shard of its own (the API
    server may still refuse it: over 1 MiB). No members -> ``[]``."""
    shards: list[str] = []
    chunk: list[str] = []
    size = 2  # "{}"
    for _, part in sorted(parts):
        n = len(part.encode())
        if chunk and size + 1 + n > max_bytes:
            shards.append("{" + ",".join(chunk) + "}")
            chunk, size = [], 2
        size += n + (1 if chunk else 0)
        chunk.append(part)
    if chunk:
        shards.append("{" + ",".join(chunk) + "}")
    return shards


def shard(entries: dict[str, dict], max_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """:func:`shard_parts` over ``entries`` (key -> entry)."""
    return shard_parts([(k, entry_part(k, v)) for k, v in entries.items()], max_bytes)


def node_name_of(cm_name: str, prefix: str) -> str | None:
    """``mindx-dl-nodeinfo-node-1`` -> ``node-1`` (None when the prefix does not match)."""
    if not cm_name.startswith(prefix) or len(cm_name) == len(prefix):
        return None
    return cm_name[len(prefix) :]
