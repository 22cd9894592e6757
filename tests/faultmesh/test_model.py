"""faultmesh.model: one meaning for occur/recover across services."""

from __future__ import annotations

import orjson

from clusterd.ingest.agentinput import check_fault
from faultmesh.model import ASSERTIONS, OCCUR, Assertion, Change, ChangeKind, Fault
from faultmesh.wire import fault_to_pb


def test_assertions_are_the_wire_strings():
    assert ASSERTIONS == ("occur", "recover", "once")
    assert Assertion("once") is Assertion.ONCE and OCCUR == "occur"
    assert orjson.dumps({"a": Assertion.RECOVER}) == b'{"a":"recover"}'


def test_change_carries_kind_and_fault_and_fault_round_trips_the_wire():
    f = Fault("dcmi", "n1", "NPU", 0, "80E18008", "RestartNPU", Assertion.OCCUR, 1, 2, {"k": "v"})
    c = Change(ChangeKind.UPDATE, f)
    assert c.kind == "update" and c.fault.key.code == "80E18008"
    back = check_fault("n1", fault_to_pb(f))
    assert back == f and back.attributes == {"k": "v"} and back.assertion == "occur"
