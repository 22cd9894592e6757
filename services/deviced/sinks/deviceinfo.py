"""The reference device-info document (``mindx-dl-deviceinfo-<node>``, reference deviced.md §5.1, §7),
rendered from deviced's state for tools that read it (``deviced --print-device-info``).

Shape: ``{"metadata": {"name", "namespace": "kube-system"}, "data": {"DeviceInfoCfg": <json string>,
"SwitchInfoCfg": <json string>, "ManuallySeparateNPU": "Ascend910-3,...", "UpgradeFaultReason":
<json string>, "Description": ...}}`` -- the ConfigMap data map, every value a string as in the
reference. Names use physical ids (``Ascend910-<phy>``); fault times are ms, UpdateTime is s;
CheckCode is the sha256 of the compact JSON of ``DeviceInfo``. During a graceful-tolerance episode
the job's chips are shown Healthy (:meth:`deviced.grace.GraceFlow.filtered_health`, the reference's
``filterDevStatus``); their fault records stay.

Every JSON value is the bytes Go's ``json.Marshal`` writes for the reference's structs
(:mod:`faultmesh.gojson`): struct fields in declaration order (``DeviceInfo, SuperPodID,
ServerIndex, CheckCode``; ``fault_type, npu_name, large_model_fault_level, fault_level,
fault_handling, fault_code, fault_time_and_level_map``), map keys sorted as strings, so a
reference ClusterD and the reference document of the same state compare byte for byte.
"""

from __future__ import annotations

import json
import time
from typing import Any

from deviced.faults import code_name
from deviced.switch import switch_record
from deviced.tables import NETWORK_CODES_ALL, switch_code
from faultmesh import gojson
from faultmesh.levels import NpuLevel

PREFIX = "huawei.com/Ascend910"
DESCRIPTION = (
    "The huawei.com/Ascend910 list of free healthy chips is kept for compatibility and is being retired; "
    "schedulers should track availability themselves."
)


def _compact(obj: Any) -> str:
    """Go's compact JSON of ``obj`` (dicts already in Go order: structs as declared, maps sorted)."""
    return gojson.marshal(obj).decode()


def _map(d: dict) -> dict:
    """A Go map: keys sorted as strings."""
    return dict(sorted(d.items()))


def npu_name(phy: int) -> str:
    """``Ascend910-<phy>``."""
    return f"Ascend910-{phy}"


def build(app) -> dict[str, Any]:
    """The document as a dict (see module docstring). ``app`` is a :class:`deviced.app.DeviceD`
    (anything with ``engine``, ``switch_state``, ``node_name`` and ``spod``)."""
    eng = app.engine
    table = eng.table
    now_s = int(time.time())
    free, unhealthy, net_unhealthy, recovering, faults = [], [], [], [], []
    manual, upgrade = [], {}
    grace = getattr(app, "grace", None)
    shown_health, shown_net = grace.filtered_health() if grace is not None else (set(), set())
    for logic, d in sorted(eng.devices.items(), key=lambda kv: kv[1].ids.phy):
        name = npu_name(d.ids.phy)
        health = "Healthy" if logic in shown_health else d.health
        network_health = "Healthy" if logic in shown_net else d.network_health
        if health == "Healthy" and not d.in_use:
            free.append(name)
        if health != "Healthy":
            unhealthy.append(name)
        if network_health != "Healthy":
            net_unhealthy.append(name)
        if d.resetting:
            recovering.append(name)
        if d.manually_separated:
            manual.append(name)
        reasons = list(d.reasons.values())
        if reasons:
            upgrade[name] = [
                {
                    "upgrade_time": r.time_ms,
                    "fault_code": code_name(eng, r.code),
                    "fault_level": r.level.name,
                    "upgrade_type": r.kind,
                }
                for r in sorted(reasons, key=lambda r: (r.time_ms, r.code))
            ]
        for network, fault_type, codes, level, unhealthy_flag in (
            (False, "CardUnhealthy", d.chip, d.level, health != "Healthy"),
            (True, "CardNetworkUnhealthy", d.network, d.network_level, network_health != "Healthy"),
        ):
            mode_reasons = [r for r in reasons if (r.code in NETWORK_CODES_ALL) == network]
            if not codes and not unhealthy_flag and not mode_reasons:
                continue
            extra = max((r.level for r in mode_reasons), default=None)
            tmap: dict[str, dict[str, Any]] = {}
            for code, st in sorted(codes.items()):
                lvl = eng.code_level(d, code)
                if extra is not None and extra > lvl:
                    lvl = extra
                tmap[table.spelling(code)] = {"fault_time": st.first_seen_ms, "fault_level": lvl.name}
            for r in mode_reasons:
                hexcode = code_name(eng, r.code)
                if hexcode not in tmap:
                    tmap[hexcode] = {"fault_time": r.time_ms, "fault_level": r.level.name}
            lvl_name = (level or NpuLevel.NotHandleFault).name
            faults.append(
                {
                    "fault_type": fault_type,
                    "npu_name": name,
                    "large_model_fault_level": lvl_name,
                    "fault_level": lvl_name,
                    "fault_handling": lvl_name,
                    "fault_code": ",".join(tmap),
                    "fault_time_and_level_map": _map(tmap),
                }
            )
    device_list = _map(
        {
            PREFIX: ",".join(free),
            f"{PREFIX}-Unhealthy": ",".join(unhealthy),
            f"{PREFIX}-NetworkUnhealthy": ",".join(net_unhealthy),
            f"{PREFIX}-Recovering": ",".join(recovering),
            f"{PREFIX}-Fault": _compact(faults),
        }
    )
    device_info = {"DeviceList": device_list, "UpdateTime": now_s}
    spods = {v for v in app.spod.values()}
    super_pod, server = spods.pop() if len(spods) == 1 else (-2, -2)
    cfg = {
        "DeviceInfo": device_info,
        "SuperPodID": super_pod,
        "ServerIndex": server,
        "CheckCode": gojson.check_code(device_info),
    }
    return {
        "metadata": {"name": f"mindx-dl-deviceinfo-{app.node_name}", "namespace": "kube-system"},
        "data": {
            "DeviceInfoCfg": _compact(cfg),
            "SwitchInfoCfg": _compact(switch_info(app, now_s)),
            "ManuallySeparateNPU": ",".join(manual),
            "UpgradeFaultReason": _compact(_map(upgrade)),
            "Description": DESCRIPTION,
        },
    }


def switch_info(app, now_s: int) -> dict[str, Any]:
    """``SwitchInfoCfg`` (§7) from the switch state."""
    st = app.switch_state
    graded = {
        (f.device_id, f.code): f.level for f in st.faults(app.node_name) if "unknown" not in f.attributes
    }
    codes, tmap = [], {}
    for ev, t in sorted(st.current.values(), key=lambda x: (x[0].switch_chip, x[0].switch_port, x[1])):
        code = switch_code(ev.event_type, ev.fault_id, ev.peer_device)
        level = graded.get((ev.switch_chip, code))
        if level is None:
            continue
        codes.append(_compact(switch_record(ev, t)))
        tmap[f"{code}_{ev.switch_chip}_{ev.switch_port}"] = {"fault_time": t, "fault_level": level}
    level, status = st.node_status([f for f in st.faults(app.node_name) if "unknown" not in f.attributes])
    return {
        "FaultCode": codes,
        "FaultLevel": level,
        "UpdateTime": now_s,
        "NodeStatus": status,
        "FaultTimeAndLevelMap": _map(tmap),
    }


def render_json(app) -> str:
    """The document as indented JSON text."""
    return json.dumps(build(app), indent=2, sort_keys=True, ensure_ascii=False)
