"""Log lines (issue 17): RFC 3339 timestamps with the zone offset; ``text`` or ``json`` format."""

from __future__ import annotations

import json
import logging
import re

import pytest

from faultmesh import log as fmlog
from faultmesh.log import event

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"


@pytest.fixture
def root():
    r = logging.getLogger()
    saved = (list(r.handlers), r.level)
    yield r
    for h in r.handlers:
        h.close()
    r.handlers[:] = saved[0]
    r.setLevel(saved[1])


def test_text_lines_have_rfc3339_timestamps(root, tmp_path):
    fmlog.setup("INFO", str(tmp_path / "t.log"))
    event(
        logging.getLogger("clusterd.history"), logging.INFO, "fault changed", kind="occur", level="RestartNPU"
    )
    line = (tmp_path / "t.log").read_text().splitlines()[-1]
    assert re.fullmatch(
        RFC3339 + r" INFO clusterd\.history fault changed kind=occur level=RestartNPU", line
    ), line


def test_json_lines_carry_the_event_and_its_fields(root, tmp_path, monkeypatch):
    monkeypatch.setenv("FAULTMESH_LOG_FORMAT", "json")
    fmlog.setup("INFO", str(tmp_path / "j.log"))
    lg = logging.getLogger("clusterd.history")
    event(lg, logging.WARNING, "fault changed", kind="occur", node="node-1", device_id=3, event="x y")
    lg.info("plain %s", "message")
    a, b = (json.loads(x) for x in (tmp_path / "j.log").read_text().splitlines()[-2:])
    assert re.fullmatch(RFC3339, a["time"])
    assert {k: a[k] for k in ("severity", "logger", "event", "kind", "node", "device_id", "field_event")} == {
        "severity": "WARNING",
        "logger": "clusterd.history",
        "event": "fault changed",
        "kind": "occur",
        "node": "node-1",
        "device_id": 3,
        "field_event": "x y",
    }
    assert b["event"] == "plain message" and b["severity"] == "INFO"


def test_unknown_format_is_refused(root):
    with pytest.raises(ValueError, match="text, json"):
        fmlog.setup("INFO", fmt="xml")


def test_clusterd_takes_log_format():
    from clusterd.app import build_parser

    assert build_parser().parse_args(["--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--log-format", "xml"])
