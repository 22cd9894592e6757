"""noded and deviced load only what they run (issue 18): without FD-OL, no numpy in an agent."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["noded.app", "deviced.app"])
def test_an_agent_without_fdol_imports_no_numpy(module):
    code = f"import sys, {module}; heavy = [m for m in ('numpy', 'torch') if m in sys.modules]; print(heavy)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_ping_record_still_gives_its_analysis_row():
    from fdol.slownet.csvfile import PingRecord
    from fdol.slownet.window import PingRow

    rec = PingRecord(7, "sdid", "1", "sdid", "2", 1.0, 3.0, 2.0, 0.0, 0.5, 0.25, 1_700_000_000_000)
    row = rec.row()
    assert isinstance(row, PingRow) and (row.task_id, row.dst_addr, row.loss_rate) == (7, "2", 0.25)
