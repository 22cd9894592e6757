"""deviced reports to a clusterd that requires mTLS and a bearer token."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from support import ClusterdProcess

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


def make_pki(tmp_path):
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "deviced-test-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    out = {"ca": tmp_path / "ca.crt"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name, serial in (("server", 2), ("client", 3)):
        k = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name).public_key(k.public_key()).serial_number(serial)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(hours=1))
        )  # fmt: skip
        if name == "server":
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        out[f"{name}.crt"] = tmp_path / f"{name}.crt"
        out[f"{name}.key"] = tmp_path / f"{name}.key"
        out[f"{name}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[f"{name}.key"].write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return out


async def test_faults_over_mtls_with_token(tmp_path):
    pki = make_pki(tmp_path)
    (tmp_path / "token").write_text("t0ken\n")
    cd = ClusterdProcess(
        tmp_path / "state",
        ["--tls-cert", str(pki["server.crt"]), "--tls-key", str(pki["server.key"]), "--tls-ca", str(pki["ca"]),
         "--token-file", str(tmp_path / "token")],
    )  # fmt: skip
    await asyncio.to_thread(cd.start)
    port = cd.grpc.rsplit(":", 1)[1]
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "tls-node", "--backend", "sim", "--clusterd", f"localhost:{port}", "--probe-interval", "0",
         "--clusterd-tls-ca", str(pki["ca"]), "--clusterd-tls-cert", str(pki["client.crt"]),
         "--clusterd-tls-key", str(pki["client.key"]), "--clusterd-token-file", str(tmp_path / "token")]
    )  # fmt: skip
    app = DeviceD(args, sim)
    await app.start()
    try:
        await asyncio.wait_for(app.agent.connected.wait(), 15)
        sim.inject(1, 0x80E18008, 1)
        for _ in range(100):
            faults = await asyncio.to_thread(cd.get_json, "/v1/faults")
            if any(f["node"] == "tls-node" and f["code"] == "80E18008" for f in faults):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"fault not in clusterd: {faults}")
    finally:
        await app.stop()
        await asyncio.to_thread(cd.stop)
