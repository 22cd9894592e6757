"""``faultmesh explain xid N`` / ``explain nvml CONDITION`` (issue 33): the NVIDIA table's meaning,
impact, handling, level and rules, as a user runs it; and the CLI's facts match what deviced loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deviced.nvml_table import NvidiaTable, xid_code
from fmtools.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_explain_xid_79_as_a_user_runs_it():
    p = subprocess.run(
        [sys.executable, "-m", "faultmesh", "explain", "xid", "79"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "services")},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "GPU has fallen off the bus" in p.stdout
    assert "level:     SeparateNPU" in p.stdout and "held until the GPU is reset" in p.stdout
    assert "impact:" in p.stdout and "handling:" in p.stdout and "RESET_GPU" in p.stdout


def run(capsys, *words: str) -> tuple[int, str, str]:
    try:
        rc = main(["explain", *words])
    except SystemExit as e:
        rc = int(e.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_xid_and_condition_explains_with_deviceds_level(capsys):
    table = NvidiaTable.load()
    for code, entry in table.entries.items():
        words = ["xid", entry.key.split()[1]] if entry.key.startswith("xid ") else ["nvml", entry.key]
        rc, out, _ = run(capsys, *words, "--json")
        facts = json.loads(out)
        assert rc == 0 and facts["level"] == entry.level.name and facts["code"] == f"{code:012X}"
        assert facts["meaning"] and facts["handling"]


def test_rules_and_the_code_spelling(capsys):
    rc, out, _ = run(capsys, f"{xid_code(13):012X}")
    assert rc == 0 and "frequency: 3 times within 86400 s -> PreSeparateNPU" in out
    rc, out, _ = run(capsys, "nvml", "thermal-slowdown")
    assert rc == 0 and "duration: lasting more than 300 s -> PreSeparateNPU" in out


@pytest.mark.parametrize(
    ("words", "rc", "text"),
    [
        (("xid", "4242"), 1, "RestartBusiness"),  # unlisted: the default level, exit 1
        (("xid", "abc"), 2, "not an XID"),
        (("xid",), 2, "needs an argument"),
        (("nvml", "nope"), 1, "unknown NVML condition"),
    ],
)
def test_unlisted_and_malformed(capsys, words, rc, text):
    got, out, err = run(capsys, *words)
    assert got == rc and text in out + err


def test_ascend_codes_unchanged(capsys):
    rc, out, _ = run(capsys, "80E18008")
    assert rc == 0 and "faultCode.json: RestartNPU" in out
