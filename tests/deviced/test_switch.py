"""Switch-fault state (reference deviced.md §7): recover, full-query replace, the L2 rule."""

from __future__ import annotations

from deviced.switch import SwitchState
from deviced.tables import SwitchFaultTable
from faultmesh.dcmi.lingqu import SwitchEvent


def sw(event_type, fault_id, peer, chip, port, assertion=1, peer_port=0):
    return SwitchEvent(event_type, fault_id, peer, peer_port, chip, port, 2, assertion, 1, 0, 1000)


def test_switch_state_recover_replace_and_l2_rule():
    st = SwitchState(SwitchFaultTable.load())
    assert st.apply(sw(0x00F1FEF5, 155914, 1, 0, 3))
    assert not st.apply(sw(0x00F1FEF5, 155914, 1, 0, 3))  # duplicate
    assert st.apply(sw(0x12345678, 1, 1, 0, 4))  # unlisted code: reported NotHandle, marked unknown
    faults = st.faults("n")
    assert [(f.device_id, f.code, f.level) for f in faults] == [
        (0, "[0x00f1fef5,155914,npu,na]", "RestartRequest"),
        (0, "[0x12345678,1,npu,na]", "NotHandle"),
    ]
    assert faults[1].attributes["unknown"] == "true" and "unknown" not in faults[0].attributes
    assert st.unlisted["[0x12345678,1,npu,na]"] == 1
    assert st.node_status(faults) == ("RestartRequest", "UnHealthy")
    # all 16 L1->L2 ports of chip 1 down: Separate
    for port in range(16):
        st.apply(sw(0x08520003, 0xFFFFFFFF, 2, 1, port))
    chip1 = [f for f in st.faults("n") if f.device_id == 1]
    assert chip1[0].level == "Separate" and chip1[0].attributes["switch_ports"].count(",") == 15
    st.apply(sw(0x08520003, 0xFFFFFFFF, 2, 1, 0, assertion=0))
    assert [f.level for f in st.faults("n") if f.device_id == 1] == ["NotHandle"]
    # a full query replaces the set; recover entries are dropped
    assert st.replace([sw(0x00F1FEF5, 155914, 1, 0, 3), sw(0x00F103B0, 155907, 9, 2, 1, assertion=0)])
    assert [f.code for f in st.faults("n")] == ["[0x00f1fef5,155914,npu,na]"]
