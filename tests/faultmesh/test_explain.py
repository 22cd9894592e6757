"""``faultmesh explain CODE`` as a user runs it (the console entry point in a subprocess, and the CLI
main with captured output), and the core knowledge behind it (faultmesh.faultinfo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultmesh import faultinfo
from fmtools.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services")}
    return subprocess.run(
        [sys.executable, "-m", "faultmesh", "explain", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_explain_80e18008_prints_meaning_level_and_rules():
    p = run_cli("80E18008")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "HBM" in out  # meaning
    assert "faultCode.json: RestartNPU" in out  # level
    assert "frequency (faultCustomization.json): 2 times within 86400 s -> ManuallySeparateNPU" in out


def test_explain_link_down_shows_every_rule_kind(capsys):
    assert main(["explain", "0x81078603"]) == 0
    out = capsys.readouterr().out
    assert "NotHandleFault" in out and "NPU到交换机断链不恢复" in out
    assert "lasting more than 20 s -> PreSeparateNPU, cleared after 60 s recovered" in out
    assert "5 times within 86400 s -> ManuallySeparateNPU, released after 172800 s" in out
    assert "kept 300 s waiting for a trigger" in out
    assert out.count("relation (relationFaultCustomization.json, as relation fault)") == 4


def test_explain_switch_and_public_and_node_codes(capsys):
    assert main(["explain", "[0x08520003,,l2,na]"]) == 0  # spelling canonicalized
    out = capsys.readouterr().out
    assert "[0x08520003,na,L2,na]" in out and "SwitchFaultCode.json: NotHandle" in out
    assert main(["explain", "010001001"]) == 0
    out = capsys.readouterr().out
    assert "publicFaultConfiguration.json: SubHealthFault" in out and "光链路脏污（芯片故障）" in out
    assert main(["explain", "2c000031"]) == 0
    assert "NodeDConfiguration.json: SeparateFault" in capsys.readouterr().out


def test_explain_json():
    p = run_cli("--json", "8C1F860B")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["known"] and d["levels"][0]["level"] == "NotHandleFault"
    assert {r["strategy"] for r in d["relations"]} == {"Separate"} and len(d["relations"]) == 2


def test_explain_unknown_code_exit_1(capsys):
    assert main(["explain", "DEAD0001"]) == 1
    out = capsys.readouterr().out
    assert "unknown" in out and "still reported" in out


@pytest.mark.parametrize("bad", ["zz", "80E1800G", "[0x1,2]", "12345678901234567"])
def test_explain_malformed_code_exit_2(bad):
    p = run_cli(bad)
    assert p.returncode == 2
    assert "error:" in p.stderr and "80E18008" in p.stderr and not p.stdout


def test_explain_help_documents_exit_status():
    p = subprocess.run(
        [sys.executable, "-m", "faultmesh", "explain", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "services")},
        timeout=60,
    )
    assert p.returncode == 0 and "exit status: 0" in p.stdout and "1 the code is unknown" in p.stdout


def test_typical_faults_listed(capsys):
    assert main(["explain", "--typical"]) == 0
    out = capsys.readouterr().out
    assert "[chip] PCIe" in out and "[node] CPU" in out and "[business plane]" in out


def test_meaning_lookup_by_value():
    assert faultinfo.meaning("20001002").code == "020001002"  # leading zero optional, as deviced reads it
    assert faultinfo.meaning("80E18005") is None
    with pytest.raises(ValueError):
        faultinfo.meaning("nope")
    assert faultinfo.level_handling("RestartNPU")[1] == "复位芯片"


def test_public_code_without_meaning_is_decoded_not_invented(capsys):
    """issue 31: 020001001, which the demo sends, showed "no description shipped". The 9-digit
    public code convention (reference clusterd.md) gives its type, default level and origin; the
    name says the reference gives no meaning. A code no table lists stays unknown."""
    assert main(["explain", "020001001"]) == 0
    out = capsys.readouterr().out
    assert "name:      chip public fault no. 1001" in out
    assert "public fault: chip, release-defined (the reference gives no meaning)" in out
    assert "default level SeparateNPU" in out and "9-digit public fault code convention" in out
    assert faultinfo.short_name("020001001") == "chip public fault no. 1001"
    assert faultinfo.public_code_structure("110001022").module.startswith("public fault: node")
    assert faultinfo.public_code_structure("0800004B") is None  # a node code: decoded otherwise (below)
    assert main(["explain", "020001009"]) == 1  # well-formed, in no table: not made known by decoding
    capsys.readouterr()
    assert faultinfo.short_name("020001009") == ""


def test_ibmc_code_without_meaning_is_decoded_by_its_top_byte(capsys):
    """issue 31: 0800004B, which the demo raises, had no description. Neither the reference nor its
    documents give one; its top byte read as the iBMC component type (as the reference's configured
    codes' top bytes follow the iBMC device-type table, an observation) names it, and the text says
    it is decoded, not a meaning. A code no table lists, or whose top byte is not a component, stays
    without one."""
    assert main(["explain", "0800004B"]) == 0
    out = capsys.readouterr().out
    assert "name:      iBMC alarm 0x004B, top byte 0x08 (PCIe Card)" in out
    assert "the reference gives no meaning" in out and "an observation" in out
    assert faultinfo.short_name("0800004B") == "iBMC alarm 0x004B, top byte 0x08 (PCIe Card)"
    assert faultinfo.short_name("2C000031") == "iBMC alarm 0x0031, top byte 0x2C (System)"
    assert faultinfo.short_name("6200000C") == ""  # listed, but 0x62 names no component
    assert faultinfo.short_name("08001234") == ""  # well-formed, in no table
