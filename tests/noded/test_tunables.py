"""noded's once-fixed values are flags with the old value as default (issue 20): the DPC memory
hold (600 s) and the cap of one IPMI call's timeout (5 s)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from noded import sources
from noded.app import build_parser
from noded.metrics import NodedMetrics
from noded.sources.bmc import Bmc
from noded.sources.storage import Dpc


def section(argv: list[str], cls):
    return sources.config_section(build_parser().parse_args(["--node-name", "n", *argv]), cls)


def test_defaults_are_the_old_values(tmp_path):
    metrics = NodedMetrics(CollectorRegistry())
    dpc = Dpc.from_config(section(["--dpc-status-file", str(tmp_path / "s")], Dpc), metrics)
    assert dpc.dpc.memory_hold_s == 600.0
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    bmc = Bmc.from_config(
        section(["--bmc-host", "127.0.0.1", "--bmc-password-file", str(pw), "--bmc-timeout", "15"], Bmc),
        metrics,
    )
    assert bmc.client.timeout_s == 5.0


def test_flags_change_them(tmp_path):
    metrics = NodedMetrics(CollectorRegistry())
    argv = ["--dpc-status-file", str(tmp_path / "s"), "--storage-memory-hold-s", "30"]
    assert Dpc.from_config(section(argv, Dpc), metrics).dpc.memory_hold_s == 30.0
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    argv = ["--bmc-host", "127.0.0.1", "--bmc-password-file", str(pw), "--bmc-timeout", "15"]
    bmc = Bmc.from_config(section([*argv, "--bmc-call-timeout-max", "8"], Bmc), metrics)
    assert bmc.client.timeout_s == 8.0
    bmc = Bmc.from_config(section([*argv, "--bmc-call-timeout-max", "30"], Bmc), metrics)
    assert bmc.client.timeout_s == 15.0  # never above the poll timeout
