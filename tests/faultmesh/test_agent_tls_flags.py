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


def _start(tmp_path, daemon: str, *flags: str) -> subprocess.CompletedProcess:
    """Run ``daemon`` with ``flags`` in ``tmp_path``; a daemon that starts instead of refusing them
    fails the test after 20 s."""
    argv = [sys.executable, "-m", daemon, "--node-name", "n1", *flags]
    if daemon == "deviced":
        argv += ["--backend", "sim"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services")}
    try:
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{daemon} started with {flags}: {e.stderr!r}")


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
    r = _start(tmp_path, daemon, "--clusterd-tls-ca", "ca.pem", *flags)
    assert r.returncode == 2 and expect in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("daemon", ["noded", "deviced"])
def test_a_client_pair_without_the_ca_is_a_usage_error(tmp_path, daemon):
    """TLS to ClusterD is on only with ``--clusterd-tls-ca``: a client cert and key without it made
    the agent talk plaintext without a word (session notes). The chart passes the CA alone."""
    for name in ("c.pem", "k.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    r = _start(tmp_path, daemon, "--tls-cert", "c.pem", "--tls-key", "k.pem")
    expect = f"error: {CERT} needs --clusterd-tls-ca/--tls-ca (the PEM CA of ClusterD's certificate)"
    assert r.returncode == 2 and expect in r.stderr, r.stderr
