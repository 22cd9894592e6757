"""A corrupt or truncated deviced state file (issue 30 "Bad input"): deviced starts with empty rule
state, says so once in its log, counts it in ``faultmesh_deviced_state_file_rejected_total{reason}``
and keeps the bad file as ``<path>.corrupt`` -- never an escalation: the chip still carrying its
fault shows its table level in clusterd, and the next state file written is a good one."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import generate_latest
from support import eventually, make_clusterd

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend

HBM = 0x80E18008  # RestartNPU; ManuallySeparateNPU through its frequency rule
TRUNCATED = json.dumps({
    "version": 2,
    "devices": {"5": {
        "reasons": [{"code": HBM, "kind": "FaultFrequency", "level": "ManuallySeparateNPU", "time_ms": 1}],
        "frequency": {str(HBM): {"times": [1, 2], "last_fault_ms": 2, "last_recover_ms": 0}},
    }},
})[:-20]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (TRUNCATED.encode(), "corrupt"),  # a write cut short (no atomic rename: another tool, a disk)
        (b"", "corrupt"),
        (b"\x00\xff\xfe garbage \x80", "unreadable"),
        (b"[1, 2, 3]", "not-an-object"),
        (json.dumps({"version": 2, "devices": [{"5": {}}]}).encode(), "bad-shape"),
    ],
    ids=["truncated", "empty", "binary", "list", "devices-list"],
)
async def test_bad_state_file_starts_empty_counted_once_never_escalates(tmp_path, caplog, content, reason):
    caplog.set_level(logging.INFO, logger="deviced")
    cd = await make_clusterd(tmp_path)
    state_file = tmp_path / "deviced-state.json"
    state_file.write_bytes(content)
    args = build_parser().parse_args([
        "--node-name", "node-x", "--clusterd", f"127.0.0.1:{cd.grpc_port}", "--backend", "sim",
        "--http-addr", "127.0.0.1:0", "--state-file", str(state_file),
    ])  # fmt: skip
    hw = SimBackend(cards=1, per_card=8)
    hw.inject(5, HBM)  # the chip carries the fault when deviced starts
    app = DeviceD(args, hw)
    try:
        await app.start()
        await eventually(lambda: app.cycles > 1, what="two cycles")
        faults = await eventually(lambda: cd.center.faults("node-x"), what="the fault in clusterd")
        assert [(f.code, f.level) for f in faults] == [("80E18008", "RestartNPU")]
        assert "upgrade" not in faults[0].attributes
        d = app.engine.devices[5]
        assert not d.reasons and not d.manually_separated and d.frequency[HBM].times != [1, 2]
        metrics = generate_latest(app.registry).decode()
        assert f'faultmesh_deviced_state_file_rejected_total{{reason="{reason}"}} 1.0' in metrics
        assert caplog.text.count("state file rejected, starting with empty state") == 1
        assert (tmp_path / "deviced-state.json.corrupt").read_bytes() == content
        saved = await eventually(
            lambda: state_file.exists() and json.loads(state_file.read_text()), what="a good state file"
        )
        assert saved["devices"]["5"]["reasons"] == [] and str(HBM) in saved["devices"]["5"]["active"]
    finally:
        await app.stop()
        await cd.stop()
