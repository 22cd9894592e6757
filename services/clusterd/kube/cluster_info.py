"""The cluster-info ConfigMaps ClusterD writes, entry by entry (pure functions, no I/O).

The write side of :mod:`clusterd.kube.formats` (which names the ConfigMaps and parses the ones
ClusterD reads): faults -> the reference's ``cluster-info-device-<i>``, ``cluster-info-switch-<i>`` and
``cluster-info-node-cm`` entries, and the deterministic sharding of those entries (reference
clusterd.md §6.5; the formats are described in :mod:`clusterd.kube.formats`).
"""

from __future__ import annotations

import json

from clusterd.kube.formats import (
    AVAILABLE_LEVELS,
    DEVICEINFO_PREFIX,
    MAX_SHARD_BYTES,
    NODEINFO_PREFIX,
    RESOURCE_PREFIX,
    SWITCH_STATUS,
    SWITCHINFO_PREFIX,
    DeviceInfoDoc,
    device_index,
)
from faultmesh import gojson
from faultmesh.levels import NODE_STATUS_BY_LEVEL, NodeLevel, level_severity
from faultmesh.model import Fault


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
            ids = {device_index(n) for n in val.split(",") if n.strip()}
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
