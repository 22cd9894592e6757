"""A clusterd that cannot start says why in one line (no traceback) and exits non-zero: a state
database that is not one, a broken public-fault table, an unknown log level (issue 19 "bad input
gets a clear error"; found by the new-user tryout)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(tmp_path, *args: str, env_extra: dict | None = None) -> tuple[int, str]:
    cmd = [
        sys.executable,
        "-m",
        "clusterd",
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        *args,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize(
    "setup, flags, code, expect",
    [
        (
            "junk_db",
            ("--state-dir", "st"),
            1,
            'error="--state-dir st: state database: file is not a database"',
        ),
        (
            "bad_table",
            ("--state-dir", "st", "--public-fault-config", "pf.json"),
            1,
            'error="TableError: pf.json: not JSON',
        ),
        (
            "bad_tokens",
            ("--state-dir", "st", "--token-file", "tokens"),
            1,
            "--token-file tokens line 3: expected name:token",
        ),
        (
            "",
            ("--state-dir", "st", "--log-level", "LOUD"),
            2,
            "error: --log-level 'LOUD': use one of DEBUG, INFO",
        ),
    ],
)
def test_start_failures_are_one_line(tmp_path, setup, flags, code, expect):
    (tmp_path / "st").mkdir()
    if setup == "junk_db":
        (tmp_path / "st" / "clusterd.db").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "pf.json").write_text("{bad")
    (tmp_path / "tokens").write_text("agents:t0ken-a\nops:t0ken-b\nt0ken-c\n")  # line 3 has no name
    rc, out = run(tmp_path, *flags)
    assert rc == code and expect in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize(
    "flags, expect",
    [
        (("--tls-cert", "cert.pem"), "error: --tls-cert needs --tls-key"),
        (("--tls-key", "key.pem"), "error: --tls-key needs --tls-cert"),
        (
            ("--tls-ca", "ca.pem"),
            "error: --tls-ca (client certificates, mTLS) needs --tls-cert and --tls-key",
        ),
    ],
)
def test_tls_flags_without_their_pair_are_a_usage_error(tmp_path, flags, expect):
    # tryout: --tls-cert without --tls-key died at bind with a TypeError (exit 1); a lone --tls-key or
    # --tls-ca was ignored and gRPC served plaintext
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    try:
        rc, out = run(tmp_path, "--state-dir", "st", *flags)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"clusterd started with {flags}: {e.stderr!r}")
    assert rc == 2 and expect in out, out
    assert "Traceback" not in out, out


def test_a_taken_grpc_port_says_so(tmp_path):
    # tryout: the bind error never said 'address already in use'
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        (tmp_path / "st").mkdir()
        rc, out = run(tmp_path, "--state-dir", "st", "--grpc-addr", f"127.0.0.1:{port}")
    assert (
        rc == 1 and f"cannot bind gRPC address 127.0.0.1:{port}: [Errno 98] Address already in use" in out
    ), out
    assert "Traceback" not in out, out
