"""faultmesh bmc-sim as a process: SIGTERM is a clean exit 0 with a 'bmc-sim stopped' line, and its
control API names a bad value without Python class names (tryout)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request


def test_sigterm_exits_0_and_bad_control_values_read_plainly(tmp_path):
    env = {**os.environ, "FAULTMESH_BMC_PASSWORD": "pw"}
    p = subprocess.Popen(
        [sys.executable, "-m", "faultmesh", "bmc-sim", "--port", "0", "--control-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        line = p.stdout.readline()
        control = re.search(r"control 127\.0\.0\.1:(\d+)", line).group(1)
        req = urllib.request.Request(
            f"http://127.0.0.1:{control}/alarms", data=json.dumps({"code": "zz"}).encode(), method="POST"
        )
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("a bad code was taken")
        except urllib.error.HTTPError as e:
            assert (e.code, json.loads(e.read())) == (400, {"error": "code must be 8 hex digits"})
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=15)
        assert p.returncode == 0 and "bmc-sim stopped" in out, out
    finally:
        if p.poll() is None:
            p.kill()


def test_control_api_binds_where_told(tmp_path):
    """issue 29: ``--address`` / ``--control-address`` bind IPMI and the control API elsewhere than
    127.0.0.1 (another host's noded, a multi-host test); the ready line names them, and nothing
    listens on 127.0.0.1 then. A bad address is a clear error, not a traceback."""
    env = {**os.environ, "FAULTMESH_BMC_PASSWORD": "pw"}
    cmd = [sys.executable, "-m", "faultmesh", "bmc-sim", "--port", "0", "--control-port", "0"]
    p = subprocess.Popen(
        [*cmd, "--address", "127.0.0.2", "--control-address", "127.0.0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        line = p.stdout.readline()
        m = re.search(r"bmc-sim listening on 127\.0\.0\.2:(\d+) control 127\.0\.0\.2:(\d+)", line)
        assert m, line
        with urllib.request.urlopen(f"http://127.0.0.2:{m.group(2)}/state", timeout=10) as r:
            assert json.loads(r.read())["alarms"] == []
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{m.group(2)}/state", timeout=10)
            raise AssertionError("the control API answered on 127.0.0.1 too")
        except urllib.error.URLError as e:
            assert isinstance(e.reason, ConnectionRefusedError), e
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=15)
    bad = subprocess.run(
        [*cmd, "--control-address", "192.0.2.1"], capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode != 0 and "cannot bind" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
