"""noded test helpers: the BMC simulator and noded as real subprocesses on loopback ports."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PASSWORD = "s3cret-pw"
READY_RE = re.compile(r"bmc-sim listening on 127\.0\.0\.1:(\d+) control 127\.0\.0\.1:(\d+)")


def free_udp_port() -> int:
    """A free UDP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BmcSim:
    """``faultmesh bmc-sim`` as a subprocess; ``port`` (UDP IPMI), ``control`` (host:port)."""

    def __init__(self, tmp: Path, user: str = "admin", password: str = PASSWORD, alarms: int = 0) -> None:
        self.user = user
        self.password = password
        self.password_file = tmp / f"bmc-password-{os.getpid()}-{id(self)}"
        self.password_file.write_text(password + "\n")
        self.log_path = tmp / f"bmc-sim-{id(self)}.log"
        self.alarms = alarms
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.control = ""

    def start(self, port: int = 0) -> BmcSim:
        cmd = [
            sys.executable,
            "-c",
            "import sys; from fmtools.cli import main; sys.exit(main())",
            "bmc-sim",
            "--port",
            str(port),
            "--user",
            self.user,
            "--password-file",
            str(self.password_file),
            "--alarms",
            str(self.alarms),
        ]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True)
        deadline = time.monotonic() + 20
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            m = READY_RE.search(line)
            if m:
                self.port, self.control = int(m.group(1)), f"127.0.0.1:{m.group(2)}"
                return self
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"bmc-sim did not start: {line!r} {self.log_path.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://{self.control}{path}", data=data, method="GET" if body is None else "POST"
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def add_alarm(
        self, code: str, device_type="Memory", device_id: int = 0, severity: int = 2, count: int = 1
    ):
        return self.call(
            "/alarms",
            {
                "code": code,
                "device_type": device_type,
                "device_id": device_id,
                "severity": severity,
                "count": count,
            },
        )

    def clear_alarms(self, **filters):
        return self.call("/alarms/clear", filters)

    def add_sel(
        self, sensor_type: int, offset: int, sensor_num: int = 0, event_type: int = 0x6F, deassert=False
    ):
        return self.call(
            "/sel",
            {
                "sensor_type": sensor_type,
                "offset": offset,
                "sensor_num": sensor_num,
                "event_type": event_type,
                "deassert": deassert,
            },
        )

    def behave(self, **kw):
        return self.call("/behaviour", kw)


def make_pki(tmp: Path) -> tuple[Path, dict[str, tuple[Path, Path]]]:
    """A throw-away CA with a server certificate (SAN localhost, 127.0.0.1) and a client certificate.
    Returns (ca.crt, {"server": (crt, key), "client": (crt, key)})."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "noded-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files: dict[str, tuple[Path, Path]] = {}
    for serial, (name, server) in enumerate((("server", True), ("client", False)), start=2):
        k = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost" if server else "noded")])
            )
            .issuer_name(ca_name)
            .public_key(k.public_key())
            .serial_number(serial)
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if server:
            san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        crt, key = tmp / f"{name}.crt", tmp / f"{name}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        files[name] = (crt, key)
    (tmp / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return tmp / "ca.crt", files


def source_ctx(name: str, node: str, pool=None, registry=None, config=None):
    """A :class:`SourceContext` for driving one noded source in a test (its own state and pool)."""
    from prometheus_client import CollectorRegistry

    from faultmesh.agent import AgentState
    from faultmesh.runtime import BlockingPool
    from faultmesh.source import SourceContext

    return SourceContext(
        name=name,
        node=node,
        state=AgentState(node),
        pool=pool if pool is not None else BlockingPool(2, f"test-{name}"),
        config=config,
        registry=registry if registry is not None else CollectorRegistry(),
    )
