"""The BMC source against bmc-sim: OEM faults, levels, bad replies, unreachable/unsupported BMC, backoff."""

from __future__ import annotations

import json
import urllib.error
from importlib import resources

import pytest
from noded_support import source_ctx
from prometheus_client import CollectorRegistry

from noded.bmc.client import BmcClient
from noded.bmc.sel import SelEventTable
from noded.levels import LevelTable
from noded.metrics import NodedMetrics
from noded.sources.bmc import COND_UNREACHABLE, COND_UNSUPPORTED, SOURCE_OEM, SOURCE_SEL, Bmc


def sel_table() -> SelEventTable:
    return SelEventTable.from_json(resources.files("noded").joinpath("sel_events.json").read_bytes())


def make_monitor(sim, *, mode="auto", timeout_s=3.0, password=None, port=None, table=None, **kw):
    registry = CollectorRegistry()
    tables = {"t": table or LevelTable.default()}
    client = BmcClient("127.0.0.1", port or sim.port, sim.user, password or sim.password, timeout_s=1.0)
    mon = Bmc(
        client=client,
        levels=lambda: tables["t"],
        sel_table=sel_table(),
        metrics=NodedMetrics(registry),
        poll_interval_s=60,
        timeout_s=timeout_s,
        mode=mode,
        **kw,
    )
    mon.ctx = source_ctx("bmc", "node-a", registry=registry)
    mon.registry = registry
    mon.tables = tables
    return mon


def faults(mon, source=SOURCE_OEM):
    return sorted(
        (f.device_type, f.device_id, f.code, f.level, f.attributes.get("unknown", ""))
        for k, f in mon.state.faults.items()
        if k.source == source
    )


def metric(mon, name, **labels):
    return mon.registry.get_sample_value(name, labels) or 0.0


async def test_oem_poll_replaces_fault_set_and_sets_status(bmc_sim):
    mon = make_monitor(bmc_sim)
    try:
        mon.publish()
        assert mon.state.node_status == "Healthy"
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        bmc_sim.add_alarm("2C000031", "Disk", 1)
        bmc_sim.add_alarm("02000007", "Disk", 1)
        bmc_sim.add_alarm("DEADBEEF", "Fan", 2)
        assert await mon.poll_once()
        assert mon.mode == "oem"
        assert mon.serial_number == "2102SIM0000001"  # Huawei OEM 0x30 0x90 (node SN)
        assert faults(mon) == [
            ("Disk", 1, "02000007", "PreSeparateFault", ""),
            ("Disk", 1, "2C000031", "SeparateFault", ""),
            ("Fan", 2, "DEADBEEF", "NotHandleFault", "true"),
            ("Memory", 3, "0800004B", "PreSeparateFault", ""),
        ]
        assert mon.state.node_status == "UnHealthy"
        assert metric(mon, "faultmesh_noded_unknown_fault_codes_total") == 1
        assert mon.state.conditions[COND_UNREACHABLE].active is False

        bmc_sim.clear_alarms(code="2C000031")
        assert await mon.poll_once()
        assert ("Disk", 1, "2C000031", "SeparateFault", "") not in faults(mon)
        assert mon.state.node_status == "PreSeparate"
        assert metric(mon, "faultmesh_noded_unknown_fault_codes_total") == 1  # still the same unknown alarm

        bmc_sim.clear_alarms()
        assert await mon.poll_once()
        assert faults(mon) == [] and mon.state.node_status == "Healthy"
        assert metric(mon, "faultmesh_noded_bmc_polls_total", result="ok") == 3
        assert metric(mon, "faultmesh_noded_bmc_last_success_timestamp_seconds") > 0
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_level_table_change_relevels_current_alarms(bmc_sim):
    mon = make_monitor(bmc_sim)
    try:
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        assert await mon.poll_once()
        assert mon.state.node_status == "PreSeparate"
        doc = {"FaultTypeCode": {"SeparateFaultCodes": ["0800004B"]}}
        mon.tables["t"] = LevelTable.from_json(json.dumps(doc))
        mon.publish()
        assert faults(mon) == [("Memory", 3, "0800004B", "SeparateFault", "")]
        assert mon.state.node_status == "UnHealthy"
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


@pytest.mark.parametrize("mode", ["short", "ragged", "absurd", "count"])
async def test_bad_oem_reply_is_counted_rejection_and_keeps_state(bmc_sim, mode):
    mon = make_monitor(bmc_sim)
    try:
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        assert await mon.poll_once()
        before = faults(mon)
        bmc_sim.add_alarm("2C000031", "Disk", 1)
        bmc_sim.behave(oem=mode)
        assert await mon.poll_once() is False
        assert faults(mon) == before
        assert mon.state.node_status == "PreSeparate"
        assert metric(mon, "faultmesh_noded_bmc_polls_total", result="rejected") == 1
        reason = {"short": "short", "ragged": "ragged", "absurd": "total", "count": "count"}[mode]
        assert metric(mon, "faultmesh_noded_bmc_errors_total", kind=f"oem-{reason}") == 1
        assert mon.state.conditions[COND_UNREACHABLE].active is False
        bmc_sim.behave(oem="ok")
        assert await mon.poll_once()
        assert len(faults(mon)) == 2
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_old_ibmc_without_oem_command_falls_back_to_sel(bmc_sim):
    bmc_sim.behave(oem="unsupported")
    mon = make_monitor(bmc_sim)
    try:
        bmc_sim.add_sel(0x0C, 0x01, sensor_num=0x10)
        assert await mon.poll_once()
        assert mon.mode == "sel"
        assert faults(mon, SOURCE_SEL) == [("Memory", 0x10, "F10C6F01", "PreSeparateFault", "")]
        assert mon.state.conditions[COND_UNSUPPORTED].active is False
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_forced_oem_on_bmc_without_it_sets_bmc_unsupported(bmc_sim):
    bmc_sim.behave(oem="unsupported")
    mon = make_monitor(bmc_sim, mode="oem")
    try:
        mon.publish()
        assert await mon.poll_once() is False
        cond = mon.state.conditions[COND_UNSUPPORTED]
        assert cond.active and cond.reason == "OemAlarmsUnsupported"
        assert mon.state.node_status == "Healthy"  # still reported
        bmc_sim.behave(oem="ok")
        assert await mon.poll_once()
        assert mon.state.conditions[COND_UNSUPPORTED].active is False
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_unreachable_bmc_keeps_state_sets_condition_and_recovers(bmc_sim):
    mon = make_monitor(bmc_sim, timeout_s=1.5)
    try:
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        assert await mon.poll_once()
        bmc_sim.behave(drop=True)
        assert await mon.poll_once() is False
        cond = mon.state.conditions[COND_UNREACHABLE]
        assert cond.active and cond.reason in ("Timeout", "Unreachable")
        assert faults(mon) == [("Memory", 3, "0800004B", "PreSeparateFault", "")]
        assert mon.state.node_status == "PreSeparate"
        assert mon.next_delay(False) == 1.0  # first failure: retry after 1 s (then 2, 4, ... <= period)
        bmc_sim.behave(drop=False)
        # the hung call may still hold the session: the monitor answers "busy" at once, never queues
        for _ in range(40):
            if await mon.poll_once():
                break
            import asyncio

            await asyncio.sleep(0.5)
        assert mon.state.conditions[COND_UNREACHABLE].active is False
        assert mon.failures == 0
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_nothing_listening_is_unreachable(bmc_sim):
    from noded_support import free_udp_port

    mon = make_monitor(bmc_sim, port=free_udp_port(), timeout_s=1.0)
    try:
        mon.publish()
        assert await mon.poll_once() is False
        assert mon.state.conditions[COND_UNREACHABLE].active
        assert mon.state.node_status == "Healthy"
        assert metric(mon, "faultmesh_noded_bmc_polls_total", result="failed") == 1
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_wrong_password_is_unreachable_with_reason(bmc_sim):
    mon = make_monitor(bmc_sim, password="wrong", timeout_s=10.0)
    try:
        assert await mon.poll_once() is False
        cond = mon.state.conditions[COND_UNREACHABLE]
        assert cond.active and cond.reason == "AuthFailed", mon.last_error
        assert "wrong" not in cond.message
        assert metric(mon, "faultmesh_noded_bmc_errors_total", kind="auth") == 1
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_slow_bmc_within_and_beyond_the_poll_timeout(bmc_sim):
    mon = make_monitor(bmc_sim, timeout_s=2.0)
    try:
        bmc_sim.add_alarm("08000001", "PCIe Card", 0, count=20)  # 2 pages
        assert await mon.poll_once()
        bmc_sim.behave(delay_s=0.2)  # slow but inside the timeout: fine
        bmc_sim.clear_alarms()
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        assert await mon.poll_once()
        assert faults(mon) == [("Memory", 3, "0800004B", "PreSeparateFault", "")]
        bmc_sim.behave(delay_s=3.0)  # slower than the poll timeout: a counted failure, state kept
        bmc_sim.clear_alarms()
        assert await mon.poll_once() is False
        assert mon.state.conditions[COND_UNREACHABLE].reason == "Timeout"
        assert faults(mon) == [("Memory", 3, "0800004B", "PreSeparateFault", "")]
        assert metric(mon, "faultmesh_noded_bmc_errors_total", kind="timeout") == 1
    finally:
        bmc_sim.behave(delay_s=0)
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_one_transient_0xd5_does_not_switch_to_the_sel(bmc_sim):
    mon = make_monitor(bmc_sim)
    try:
        assert await mon.poll_once()  # auto -> oem (and past requests a previous test left queued)
        assert mon.mode == "oem"
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        bmc_sim.behave(oem="busy-once")  # the next alarm query is answered 0xD5, then all is well
        assert await mon.poll_once() is False  # a rejected poll: state kept, retried with the backoff
        assert mon.mode != "sel"
        assert await mon.poll_once()
        assert mon.mode == "oem"
        assert [f[2] for f in faults(mon)] == ["0800004B"]
        bmc_sim.call("/alarms/clear", {})
        assert await mon.poll_once()
        assert faults(mon) == []  # a cleared alarm leaves
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_after_a_fallback_the_oem_alarms_are_tried_again(bmc_sim):
    now = [1000.0]
    mon = make_monitor(bmc_sim, clock=lambda: now[0], oem_retry_s=100.0)
    try:
        bmc_sim.behave(oem="unsupported")
        bmc_sim.add_sel(0x0C, 0x01, sensor_num=0x10)
        assert await mon.poll_once()
        assert mon.mode == "sel" and len(faults(mon, SOURCE_SEL)) == 1
        bmc_sim.behave(oem="ok")
        bmc_sim.add_alarm("0800004B", "Memory", 3)
        now[0] += 50
        assert await mon.poll_once()
        assert mon.mode == "sel"  # not yet: the OEM query is retried every oem_retry_s
        now[0] += 51
        assert await mon.poll_once()
        assert mon.mode == "oem"
        assert [f[2] for f in faults(mon)] == ["0800004B"]
        assert faults(mon, SOURCE_SEL) == []  # the SEL-derived faults go with the SEL
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


async def test_a_serial_number_over_128_chars_never_reaches_the_wire(bmc_sim):
    bmc_sim.behave(serial="S" * 200)
    mon = make_monitor(bmc_sim)
    got = []
    mon.on_serial = got.append
    try:
        assert await mon.poll_once()
        assert mon.mode == "oem" and mon.serial_number == "" and got == []
        bmc_sim.behave(serial="2102SIM0000009")
        assert await mon.poll_once()
        assert got == ["2102SIM0000009"]
    finally:
        mon.client.close()
        mon.ctx.pool.shutdown()


def test_bmc_sim_refuses_alarm_fields_an_ibmc_record_cannot_hold(bmc_sim):
    """bmc-sim's control API: a device id or severity outside one byte (the OEM alarm record's
    field) is a 400, not an alarm stored wrapped (-99 became Memory 157)."""
    for body in (
        {"code": "0800004B", "device_type": "Memory", "device_id": -99},
        {"code": "0800004B", "device_type": "Memory", "device_id": 256},
        {"code": "0800004B", "device_type": "Memory", "device_id": 250, "count": 10},
        {"code": "0800004B", "device_type": "Memory", "severity": 300},
    ):
        with pytest.raises(urllib.error.HTTPError) as e:
            bmc_sim.call("/alarms", body)
        assert e.value.code == 400, body
    assert bmc_sim.call("/alarms", {"code": "0800004B", "device_type": "Memory", "device_id": 255}) == {
        "alarms": 1
    }
