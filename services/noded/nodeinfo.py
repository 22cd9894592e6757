"""The reference node-info document (``mindx-dl-nodeinfo-<node>`` data) with its CheckCode.

Source: reference noded.md §4. ``FaultDevInfo`` = ``{"FaultDevList": [{"DeviceType", "DeviceId",
"FaultCode": [...], "FaultLevel"}], "NodeStatus"}`` with Go field order; ``CheckCode`` = lowercase
hex SHA-256 of Go's compact ``json.Marshal`` of it; the document is
``{"NodeInfo": <FaultDevInfo>, "CheckCode": "<hex>"}`` plus ``updateTime`` (RFC 3339, local time).

Differences from the reference, deliberate: devices are listed in the order the BMC reported them
(the reference uses Go map order, i.e. random); codes not in the level table are included as
NotHandleFault (the reference drops them).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable

from faultmesh import gojson
from faultmesh.files import atomic_write
from faultmesh.levels import NodeLevel
from faultmesh.model import Fault
from noded.levels import node_status


def go_json(obj) -> str:
    """Compact JSON as Go's ``json.Marshal`` writes it for these documents (:func:`faultmesh.gojson.marshal`):
    no spaces, key order as given, non-ASCII kept, ``<``, ``>``, ``&``, U+2028/U+2029 escaped."""
    return gojson.marshal(obj).decode()


def fault_dev_info(faults: Iterable[Fault]) -> dict:
    """Node faults (BMC sources) -> the ``FaultDevInfo`` object (dict in Go field order).

    Devices keyed by (DeviceType, DeviceId) in first-seen order; codes de-duplicated in first-seen
    order; ``FaultLevel`` = highest level of the device's codes; ``NodeStatus`` from the worst device.
    """
    devices: dict[tuple[str, int], dict] = {}
    levels: dict[tuple[str, int], NodeLevel] = {}
    for f in faults:
        key = (f.device_type, f.device_id)
        try:
            lv = NodeLevel[f.level]
        except KeyError:
            lv = NodeLevel.NotHandleFault
        d = devices.get(key)
        if d is None:
            d = devices[key] = {
                "DeviceType": f.device_type,
                "DeviceId": int(f.device_id),
                "FaultCode": [],
                "FaultLevel": "",
            }
            levels[key] = lv
        if f.code not in d["FaultCode"]:
            d["FaultCode"].append(f.code)
        levels[key] = max(levels[key], lv)
    for key, d in devices.items():
        d["FaultLevel"] = levels[key].name
    return {"FaultDevList": list(devices.values()), "NodeStatus": node_status(levels.values())}


def check_code(info: dict) -> str:
    """Lowercase hex SHA-256 of the compact Go JSON of a ``FaultDevInfo`` object."""
    return gojson.check_code(info)


def node_info_document(info: dict, now: dt.datetime | None = None) -> dict:
    """The ConfigMap data: ``NodeInfo`` (JSON string of {NodeInfo, CheckCode}) and ``updateTime``."""
    now = now or dt.datetime.now().astimezone()
    inner = {"NodeInfo": info, "CheckCode": check_code(info)}
    return {"NodeInfo": go_json(inner), "updateTime": now.isoformat(timespec="seconds")}


def should_publish(info: dict) -> bool:
    """The reference writes the document only with a fault device or a non-Healthy status
    (otherwise it deletes it)."""
    return bool(info["FaultDevList"]) or info["NodeStatus"] != "Healthy"


def write_document(path: str, info: dict) -> bool:
    """Write the document atomically to ``path`` (JSON), or remove ``path`` when the node is
    healthy with no fault devices (as the reference deletes its ConfigMap). Returns True when written."""
    if not should_publish(info):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return False
    atomic_write(path, json.dumps(node_info_document(info), indent=2) + "\n")
    return True
