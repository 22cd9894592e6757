"""bmc-sim speaks real IPMI: Debian's ipmitool and the pyghmi client against it (issue 3 "BMC simulator")."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from noded.bmc import oem
from noded.bmc.client import BmcAuthError, BmcClient, BmcCommandError

IPMITOOL = shutil.which("ipmitool")
needs_ipmitool = pytest.mark.skipif(
    IPMITOOL is None, reason="ipmitool not installed (apt-get install ipmitool; .ci/run installs it)"
)


def ipmitool(sim, *args: str) -> str:
    cmd = [
        IPMITOOL,
        "-I",
        "lanplus",
        "-H",
        "127.0.0.1",
        "-p",
        str(sim.port),
        "-U",
        sim.user,
        "-P",
        sim.password,
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"{args}: rc={out.returncode} {out.stderr}"
    return out.stdout


@needs_ipmitool
def test_ipmitool_chassis_oem_and_sel(bmc_sim):
    status = ipmitool(bmc_sim, "chassis", "status")
    assert "System Power         : on" in status

    info = ipmitool(bmc_sim, "mc", "info")
    assert "Manufacturer ID           : 2011" in info  # Huawei: spec layout of Get Device ID

    bmc_sim.add_alarm("0800004B", device_type="Memory", device_id=3, severity=2)
    bmc_sim.add_alarm("2C000031", device_type="System", device_id=0, severity=3)
    raw = ipmitool(
        bmc_sim, "raw", "0x30", "0x94", "0xdb", "0x07", "0x00", "0x40", "0x00", "0x00", "0x00", "0x0e", "0xff"
    )
    data = bytes(int(b, 16) for b in raw.split())
    page = oem.parse_reply(data)
    assert page.total == 2
    assert [(r.code, r.device_type, r.device_id, r.severity) for r in page.records] == [
        ("0800004B", "Memory", 3, 2),
        ("2C000031", "System", 0, 3),
    ]

    bmc_sim.add_sel(0x0C, 0x01, sensor_num=0x10)
    sel_list = ipmitool(bmc_sim, "sel", "list")
    assert "Memory #0x10 | Uncorrectable ECC | Asserted" in sel_list
    ipmitool(bmc_sim, "sel", "clear")
    assert bmc_sim.call("/state")["sel_entries"] == 0


@needs_ipmitool
def test_ipmitool_wrong_password_rejected(bmc_sim):
    cmd = [
        IPMITOOL,
        "-I",
        "lanplus",
        "-H",
        "127.0.0.1",
        "-p",
        str(bmc_sim.port),
        "-U",
        "admin",
        "-P",
        "nope",
        "chassis",
        "status",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_pyghmi_client_pages_alarms(bmc_sim):
    bmc_sim.add_alarm("08000001", device_type="PCIe Card", device_id=0, count=40)
    c = BmcClient("127.0.0.1", bmc_sim.port, bmc_sim.user, bmc_sim.password, timeout_s=2)
    try:
        dev = c.device_id()
        assert dev.manufacturer_id == 2011
        assert c.chassis_power_on() is True
        alarms = c.oem_alarms()
        assert [a.code for a in alarms] == [f"{0x08000001 + i:08X}" for i in range(40)]
        assert [a.device_id for a in alarms] == list(range(40))
        assert bmc_sim.call("/state")["requests"] >= 3  # 40 alarms = 3 pages of 14
        with pytest.raises(BmcCommandError) as e:
            c.raw(0x30, 0x7F)
        assert e.value.code == 0xC1 and e.value.unsupported
    finally:
        c.close()


def test_pyghmi_client_wrong_password(bmc_sim):
    c = BmcClient("127.0.0.1", bmc_sim.port, bmc_sim.user, "wrong", timeout_s=2)
    with pytest.raises(BmcAuthError) as e:
        c.device_id()
    assert "wrong" not in str(e.value)


def test_bmc_sim_cli_verbs(bmc_sim):
    from fmtools.cli import main

    assert (
        main(
            [
                "bmc-sim",
                "inject",
                "--control",
                bmc_sim.control,
                "--code",
                "0800004B",
                "--device-type",
                "Memory",
                "--device-id",
                "3",
            ]
        )
        == 0
    )
    assert (
        main(["bmc-sim", "inject", "--control", bmc_sim.control, "--sel", "cpu-ierr", "--sensor-num", "2"])
        == 0
    )
    st = bmc_sim.call("/state")
    assert st["alarms"] == [
        {"code": "0800004B", "severity": 2, "device_type": "Memory", "type_byte": 1, "device_id": 3}
    ]
    assert st["sel"][0]["sensor_type"] == 0x07 and st["sel"][0]["sensor_num"] == 2
    assert main(["bmc-sim", "clear", "--control", bmc_sim.control, "--code", "0800004B"]) == 0
    assert main(["bmc-sim", "clear", "--control", bmc_sim.control, "--sel"]) == 0
    st = bmc_sim.call("/state")
    assert st["alarms"] == [] and st["sel_entries"] == 0
    assert main(["bmc-sim", "inject", "--control", bmc_sim.control]) == 1  # nothing to inject: clear error
