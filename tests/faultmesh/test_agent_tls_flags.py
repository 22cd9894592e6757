"""The agents' ClusterD TLS flags as a user meets them (tryout): ``--clusterd-tls-cert`` and
``--clusterd-tls-key`` (aliases ``--tls-cert`` / ``--tls-key``) come as a pair, as clusterd's
``--tls-cert`` / ``--tls-key`` do; one without the other is a usage error naming the missing flag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CERT, KEY = "--clusterd-tls-cert/--tls-cert", "--clusterd-tls-key/--tls-key"


@pytest.mark.parametrize(
    "daemon, flags, expect",
    [
        ("noded", ("--tls-cert", "c.pem"), f"error: {CERT} needs {KEY} (the PEM private key"),
        ("noded", ("--clusterd-tls-key", "k.pem"), f"error: {KEY} needs {CERT} (the PEM client certificate)"),
        ("deviced", ("--clusterd-tls-cert", "c.pem"), f"error: {CERT} needs {KEY}"),
        ("deviced", ("--tls-key", "k.pem"), f"error: {KEY} needs {CERT}"),
    ],
)
def test_a_client_cert_without_its_key_is_a_usage_error(tmp_path, daemon, flags, expect):
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    argv = [sys.executable, "-m", daemon, "--node-name", "n1", "--clusterd-tls-ca", "ca.pem", *flags]
    if daemon == "deviced":
        argv += ["--backend", "sim"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services")}
    try:
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{daemon} started with {flags}: {e.stderr!r}")
    assert r.returncode == 2 and expect in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
