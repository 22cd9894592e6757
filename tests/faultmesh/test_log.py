"""Log lines (issue 17): RFC 3339 timestamps with the zone offset; ``text`` or ``json`` format."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading

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


DAEMONS = {
    "clusterd": ["-m", "clusterd", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--state-dir", "{tmp}"],
    "noded": ["-m", "noded", "--node-name", "n1", "--clusterd", "127.0.0.1:9", "--http-addr", "127.0.0.1:0",
              "--pingmesh-backend", "off"],
    "deviced": ["-m", "deviced", "--node-name", "n1", "--clusterd", "127.0.0.1:9", "--backend", "sim",
                "--http-addr", "127.0.0.1:0"],
    "bmc-sim": ["-m", "faultmesh", "bmc-sim", "--port", "0", "--address", "127.0.0.1"],
}  # fmt: skip
START_LINES = {"bmc-sim": 1}  # how many lines each writes at start (others: at least 3)


def _daemon(name: str, tmp_path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """Start daemon ``name``; its log lines (stderr) are read from ``proc.stderr``."""
    argv = [a.replace("{tmp}", str(tmp_path / name)) for a in DAEMONS[name]]
    full_env = {k: v for k, v in os.environ.items() if k != "FAULTMESH_LOG_FORMAT"}
    full_env.update({"FAULTMESH_BMC_PASSWORD": "pw", **(env or {})})
    return subprocess.Popen(
        [sys.executable, *argv, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def _first_lines(proc: subprocess.Popen, n: int, timeout_s: float = 30.0) -> list[str]:
    """The first ``n`` log lines (stderr) (or fewer when the process ends), then the process is stopped."""
    lines: list[str] = []
    done = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if len(lines) >= n:
                break
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    done.wait(timeout_s)
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    t.join(5)
    proc.stderr.close()
    return lines


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_every_daemon_takes_log_format_json(name, tmp_path):
    """``<daemon> --log-format json``: every line it writes is one JSON object with an RFC 3339 time."""
    lines = _first_lines(_daemon(name, tmp_path, "--log-format", "json"), START_LINES.get(name, 3))
    assert lines, f"{name} wrote nothing"
    for line in lines:
        d = json.loads(line)
        assert re.fullmatch(RFC3339, d["time"]) and d["severity"] and d["event"], line


@pytest.mark.parametrize("name", ["clusterd", "noded", "deviced"])
def test_every_daemon_reads_the_format_from_env_and_names_the_allowed_values(name, tmp_path):
    lines = _first_lines(_daemon(name, tmp_path, env={"FAULTMESH_LOG_FORMAT": "json"}), 2)
    assert lines and all(json.loads(line)["event"] for line in lines), lines
    proc = _daemon(name, tmp_path, env={"FAULTMESH_LOG_FORMAT": "xml"})
    _, out = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "'xml'" in out and "text, json" in out and "Traceback" not in out
    proc = _daemon(name, tmp_path, "--log-format", "xml")
    _, out = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'xml'" in out and "'text', 'json'" in out, out


def test_rfc3339_matches_datetime_at_ms_and_second_edges():
    # the per-second cache must print what datetime.isoformat prints, rounding and carry included
    from datetime import datetime

    base = 1796147404
    times = [
        base + ms / 1000 + d for ms in (0, 1, 116, 499, 998, 999) for d in (0, -5e-7, 5e-7, 4.9e-7, -1e-7)
    ]
    times += [1796147404.1169994, 2777395071.9109993, base + 0.9999996, base - 0.0000004]
    for t in times:
        assert fmlog.rfc3339(t) == datetime.fromtimestamp(t).astimezone().isoformat(
            timespec="milliseconds"
        ), t
