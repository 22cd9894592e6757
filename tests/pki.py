"""Test PKI: a CA with a server and a client certificate, for TLS / mTLS to a real clusterd."""

from __future__ import annotations

import datetime
import ipaddress

import pytest


def make_pki(tmp_path, server_ips: tuple[str, ...] = ()):
    """A CA, a server certificate for ``localhost`` (and each of ``server_ips``) and a client
    certificate (EC P-256, valid an hour) under ``tmp_path``: paths keyed ``ca``, ``server.crt``,
    ``server.key``, ``client.crt``, ``client.key``. Skips without the ``cryptography`` package."""
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
            names = [
                x509.DNSName("localhost"),
                *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips),
            ]
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
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
