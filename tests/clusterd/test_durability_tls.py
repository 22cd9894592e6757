"""ClusterD as an operator runs it: a real process, killed with -9, restarted; TLS/mTLS; the token."""

from __future__ import annotations

import datetime
import subprocess
import sys

import grpc
import pytest
from support import make_clusterd, public_request

from faultmesh._pb import pubfault_pb2_grpc


def test_acked_fault_survives_kill_9_with_its_first_seen_time(clusterd_process, tmp_path):
    cd = clusterd_process()
    with grpc.insecure_channel(cd.grpc) as ch:
        stub = pubfault_pb2_grpc.PubFaultStub(ch)
        for i in range(20):
            assert stub.SendPublicFault(public_request(f"fault-{i:04d}"), timeout=5).code == 0
    before = {f["attributes"]["faultId"]: f["first_seen_ms"] for f in cd.get_json("/v1/faults")}
    assert len(before) == 20
    cd.kill9()
    again = clusterd_process(state_dir=cd.state_dir)
    after = {f["attributes"]["faultId"]: f["first_seen_ms"] for f in again.get_json("/v1/faults")}
    assert after == before
    # and the CLI shows them
    out = subprocess.run(
        [sys.executable, "-m", "faultmesh", "faults", "--http", again.http],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0
    assert out.stdout.splitlines()[0].split() == [
        "NODE",
        "DEVICE",
        "ID",
        "CODE",
        "NAME",
        "LEVEL",
        "SOURCE",
        "FIRST",
        "SEEN",
        "LAST",
        "SEEN",
        "ACKNOWLEDGED",
    ]
    assert sum("010001001" in line for line in out.stdout.splitlines()) == 20


def test_sigterm_stops_cleanly(clusterd_process):
    cd = clusterd_process()
    assert cd.stop() == 0
    assert "clusterd stopped" in cd.log_text()


def _make_pki(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def pem_key(k):
        return k.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    now = datetime.datetime.now(datetime.UTC)
    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "faultmesh-test-ca")])
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

    def leaf(cn: str, serial: int, server: bool):
        k = key()
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(ca_name)
            .public_key(k.public_key())
            .serial_number(serial)
            .not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        return k, b.sign(ca_key, hashes.SHA256())

    files = {}
    for name, (k, c) in {"server": leaf("localhost", 2, True), "client": leaf("noded", 3, False)}.items():
        (tmp_path / f"{name}.key").write_bytes(pem_key(k))
        (tmp_path / f"{name}.crt").write_bytes(c.public_bytes(serialization.Encoding.PEM))
        files[name] = (tmp_path / f"{name}.crt", tmp_path / f"{name}.key")
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return tmp_path / "ca.crt", files


async def test_mtls_round_trip_and_plaintext_refused(tmp_path):
    ca, files = _make_pki(tmp_path)
    (tmp_path / "token").write_text("s3cret\n")
    cd = await make_clusterd(
        tmp_path,
        "--tls-cert",
        str(files["server"][0]),
        "--tls-key",
        str(files["server"][1]),
        "--tls-ca",
        str(ca),
        "--token-file",
        str(tmp_path / "token"),
    )
    opts = (("grpc.ssl_target_name_override", "localhost"),)
    try:
        creds = grpc.ssl_channel_credentials(
            ca.read_bytes(), files["client"][1].read_bytes(), files["client"][0].read_bytes()
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{cd.grpc_port}", creds, options=opts) as ch:
            stub = pubfault_pb2_grpc.PubFaultStub(ch)
            r = await stub.SendPublicFault(
                public_request("fault-tls1"), timeout=5, metadata=(("authorization", "Bearer s3cret"),)
            )
            assert r.code == 0
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.SendPublicFault(public_request("fault-tls2"), timeout=5)
            assert (e.value.code(), e.value.details()) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "bearer token required",
            )
            with pytest.raises(grpc.aio.AioRpcError) as e:  # a wrong token is told apart from none
                await stub.SendPublicFault(
                    public_request("fault-tls2"), timeout=5, metadata=(("authorization", "Bearer nope"),)
                )
            assert e.value.details() == "bearer token does not match"
        # no client certificate: the handshake fails
        no_cert = grpc.ssl_channel_credentials(ca.read_bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{cd.grpc_port}", no_cert, options=opts) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pubfault_pb2_grpc.PubFaultStub(ch).SendPublicFault(
                    public_request("fault-tls3"), timeout=3
                )
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await pubfault_pb2_grpc.PubFaultStub(ch).SendPublicFault(
                    public_request("fault-tls4"), timeout=3
                )
        assert [f.attributes["faultId"] for f in cd.center.faults()] == ["fault-tls1"]
    finally:
        await cd.stop()


async def test_unary_qps_limit_answers_like_the_reference(tmp_path):
    cd = await make_clusterd(tmp_path, "--unary-qps", "5")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            stub = pubfault_pb2_grpc.PubFaultStub(ch)
            errors = []
            for i in range(8):
                try:
                    await stub.SendPublicFault(public_request(f"fault-q{i:03d}"), timeout=5)
                except grpc.aio.AioRpcError as e:
                    errors.append((e.code(), e.details()))
        assert errors and errors[0] == (
            grpc.StatusCode.UNKNOWN,
            "qps exceeded, method=/PubFault/SendPublicFault",
        )
        assert cd.rejected.labels("PubFault", "qps_exceeded")._value.get() == len(errors)
    finally:
        await cd.stop()


async def test_services_of_later_issues_answer_unimplemented_or_serve(cd):
    from faultmesh._pb import recover_pb2, recover_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        try:
            r = await recover_pb2_grpc.RecoverStub(ch).HealthCheck(
                recover_pb2.ClientInfo(jobId="job-1"), timeout=5
            )
            assert r.code == 0
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_connections_above_the_cap_are_refused(tmp_path):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    cd = await make_clusterd(tmp_path, "--max-connections", "2")
    chans = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{cd.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(3)
    ]
    try:
        results = []
        for ch in chans:
            try:
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3)
                results.append("ok")
            except grpc.aio.AioRpcError as e:
                results.append(e.code())
        assert results == ["ok", "ok", grpc.StatusCode.UNAVAILABLE]
    finally:
        for ch in chans:
            await ch.close()
        await cd.stop()
