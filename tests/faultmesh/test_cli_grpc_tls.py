"""The CLI's gRPC commands reach a clusterd whose gRPC port takes TLS only (issue 29, between hosts):
``--grpc-tls-ca`` (env FAULTMESH_GRPC_TLS_CA) turns TLS on, ``--grpc-tls-cert/--grpc-tls-key`` add
the client certificate a clusterd with ``--tls-ca`` asks for. Before, every gRPC command (pubfault
send, trace, switch-nic, stress-test, trainsim) dialled plaintext and could not reach such a
clusterd at all. Flag mistakes are usage errors (exit 2) naming the flag, before anything is sent."""

from __future__ import annotations

import pytest
from pki import make_pki
from support import ClusterdProcess
from support import cli_inproc as cli

from fmtools.cli.common import EXIT_NOT_FOUND, EXIT_UNREACHABLE, EXIT_USAGE

TOKEN = "tls-t0ken"


@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """A clusterd with mTLS on its gRPC port and a token; yields (clusterd, pki, the CLI's flags)."""
    tmp = tmp_path_factory.mktemp("cli-tls")
    pki = make_pki(tmp)
    (tmp / "token").write_text(TOKEN + "\n")
    tls = {"--tls-cert": pki["server.crt"], "--tls-key": pki["server.key"], "--tls-ca": pki["ca"]}
    extra = [a for flag, path in tls.items() for a in (flag, str(path))]
    cd = ClusterdProcess(tmp / "state", [*extra, "--token-file", str(tmp / "token")]).start()
    port = cd.grpc.rsplit(":", 1)[1]
    flags = ["--grpc", f"localhost:{port}", "--http", cd.http, "--token-file", str(tmp / "token")]
    try:
        yield cd, pki, flags
    finally:
        cd.stop()


def _send(capsys, flags, *tls: str, node: str = "tls-node"):
    return cli(capsys, "pubfault", "send", *flags, *tls, "--node", node, "--new-node", "--code", "010001001")


def test_pubfault_over_mtls_reaches_clusterd(capsys, mtls):
    cd, pki, flags = mtls
    tls = ["--grpc-tls-ca", str(pki["ca"]), "--grpc-tls-cert", str(pki["client.crt"])]
    r = _send(capsys, flags, *tls, "--grpc-tls-key", str(pki["client.key"]))
    assert r.returncode == 0, r.stderr
    assert any(f["node"] == "tls-node" and f["code"] == "010001001" for f in cd.get_json("/v1/faults"))


def test_plaintext_to_a_tls_port_is_unreachable(capsys, mtls):
    cd, _pki, flags = mtls
    r = _send(capsys, flags, node="plain-node")
    assert r.returncode == EXIT_UNREACHABLE and "clusterd unreachable" in r.stderr, r.stderr
    assert not any(f["node"] == "plain-node" for f in cd.get_json("/v1/faults"))


def test_trainsim_over_mtls_from_the_environment(capsys, mtls, monkeypatch):
    """trainsim's own channel (grpc.aio) takes the same flags, here from the environment: an unknown
    job is clusterd's answer (Init code 502, exit 4), which needs the TLS handshake to succeed."""
    _cd, pki, flags = mtls
    monkeypatch.setenv("FAULTMESH_GRPC_TLS_CA", str(pki["ca"]))
    monkeypatch.setenv("FAULTMESH_GRPC_TLS_CERT", str(pki["client.crt"]))
    monkeypatch.setenv("FAULTMESH_GRPC_TLS_KEY", str(pki["client.key"]))
    r = cli(capsys, "trainsim", *flags, "--job", "no-such-job", "--no-reconnect")
    assert r.returncode == EXIT_NOT_FOUND and "Init: code 502" in r.stderr, r.stderr


def test_server_name_checks_the_certificate_against_another_name(capsys, mtls):
    """Dialled by IP (the certificate names only ``localhost``, as a port-forward's 127.0.0.1 is not
    the Service's name) the TLS check fails; ``--grpc-tls-server-name localhost`` passes it."""
    cd, pki, flags = mtls
    by_ip = [*flags, "--grpc", cd.grpc]  # 127.0.0.1:port
    tls = ["--grpc-tls-ca", str(pki["ca"]), "--grpc-tls-cert", str(pki["client.crt"])]
    tls += ["--grpc-tls-key", str(pki["client.key"])]
    r = _send(capsys, by_ip, *tls, node="ip-node")
    assert r.returncode == EXIT_UNREACHABLE, r.stderr
    r = _send(capsys, by_ip, *tls, "--grpc-tls-server-name", "localhost", node="ip-node")
    assert r.returncode == 0, r.stderr
    assert any(f["node"] == "ip-node" for f in cd.get_json("/v1/faults"))


@pytest.mark.parametrize(
    "tls, expect",
    [
        (["--grpc-tls-ca", "{ca}", "--grpc-tls-cert", "{crt}"], "--grpc-tls-cert needs --grpc-tls-key"),
        (["--grpc-tls-ca", "{ca}", "--grpc-tls-key", "{key}"], "--grpc-tls-key needs --grpc-tls-cert"),
        (["--grpc-tls-cert", "{crt}", "--grpc-tls-key", "{key}"], "--grpc-tls-cert needs --grpc-tls-ca"),
        (["--grpc-tls-ca", "{missing}"], "cannot read --grpc-tls-ca file"),
        (["--grpc-tls-ca", "{token}"], "holds no PEM block"),
        (["--grpc-tls-server-name", "localhost"], "--grpc-tls-server-name needs --grpc-tls-ca"),
    ],
)
def test_flag_mistakes_are_usage_errors(capsys, tmp_path, mtls, tls, expect):
    cd, pki, flags = mtls
    paths = {"ca": pki["ca"], "crt": pki["client.crt"], "key": pki["client.key"]}
    paths |= {"missing": tmp_path / "nope.pem", "token": flags[-1]}
    r = _send(capsys, flags, *(a.format(**paths) for a in tls), node="usage-node")
    assert r.returncode == EXIT_USAGE and expect in r.stderr, r.stderr
    assert not any(f["node"] == "usage-node" for f in cd.get_json("/v1/faults"))


def test_trainsim_reconnect_backoff_is_a_checked_flag(capsys):
    """``trainsim --reconnect-backoff-max`` (5 s, 0.5..3600 as the agents' ``--clusterd-backoff-max``)."""
    from fmtools.cli import build_parser

    assert build_parser().parse_args(["trainsim", "--job", "j"]).reconnect_backoff_max == 5.0
    assert (
        build_parser()
        .parse_args(["trainsim", "--job", "j", "--reconnect-backoff-max", "30"])
        .reconnect_backoff_max
        == 30.0
    )
    r = cli(capsys, "trainsim", "--job", "j", "--reconnect-backoff-max", "0")
    assert r.returncode == EXIT_USAGE and "'0' is not a number in 0.5..3600" in r.stderr, r.stderr
