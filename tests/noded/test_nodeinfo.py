"""node-info document and CheckCode (reference noded.md §4)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

from faultmesh.model import Fault
from noded import nodeinfo

WORKED = (
    '{"FaultDevList":[{"DeviceType":"Memory","DeviceId":3,"FaultCode":["0800004B"],"FaultLevel":"PreSeparateFault"},'
    '{"DeviceType":"Disk","DeviceId":1,"FaultCode":["2C000031","02000007"],"FaultLevel":"SeparateFault"}],'
    '"NodeStatus":"UnHealthy"}'
)
WORKED_CHECK = "fc0411006f1ec49beb34974f5a412dab379ae57f9cc3ad2f2c7837d0243cbc5c"


def f(dtype, did, code, level):
    return Fault("bmc-oem", "node-01", dtype, did, code, level)


def test_worked_example_check_code():
    info = nodeinfo.fault_dev_info(
        [
            f("Memory", 3, "0800004B", "PreSeparateFault"),
            f("Disk", 1, "2C000031", "SeparateFault"),
            f("Disk", 1, "02000007", "PreSeparateFault"),
            f("Disk", 1, "2C000031", "SeparateFault"),  # duplicate code: listed once
        ]
    )
    assert nodeinfo.go_json(info) == WORKED
    assert nodeinfo.check_code(info) == WORKED_CHECK


def test_healthy_document_and_levels():
    info = nodeinfo.fault_dev_info([])
    assert nodeinfo.go_json(info) == '{"FaultDevList":[],"NodeStatus":"Healthy"}'
    assert not nodeinfo.should_publish(info)
    info = nodeinfo.fault_dev_info([f("Fan", 2, "0100000D", "NotHandleFault")])
    assert info["NodeStatus"] == "Healthy" and nodeinfo.should_publish(info)
    info = nodeinfo.fault_dev_info([f("PSU", 0, "0500000D", "PreSeparateFault")])
    assert info["NodeStatus"] == "PreSeparate"


def test_go_json_escapes_like_go():
    assert nodeinfo.go_json({"a": "<b>&"}) == '{"a":"\\u003cb\\u003e\\u0026"}'


def test_document_shape():
    info = json.loads(WORKED)
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    doc = nodeinfo.node_info_document(info, now)
    assert doc["updateTime"] == "2026-01-02T03:04:05+08:00"
    inner = json.loads(doc["NodeInfo"])
    assert list(inner) == ["NodeInfo", "CheckCode"]
    assert inner["CheckCode"] == WORKED_CHECK
    assert (
        hashlib.sha256(json.dumps(inner["NodeInfo"], separators=(",", ":")).encode()).hexdigest()
        == WORKED_CHECK
    )


def test_write_document_and_delete_when_healthy(tmp_path):
    p = tmp_path / "node-info.json"
    assert nodeinfo.write_document(str(p), json.loads(WORKED))
    doc = json.loads(p.read_text())
    assert json.loads(doc["NodeInfo"])["CheckCode"] == WORKED_CHECK
    assert not nodeinfo.write_document(str(p), {"FaultDevList": [], "NodeStatus": "Healthy"})
    assert not p.exists()
