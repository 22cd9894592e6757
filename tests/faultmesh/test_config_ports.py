"""A port above 65535 in a daemon's address or port flag is a usage error (exit 2 naming the flag), as
the CLI's "Port out of range 0-65535" (new-user tryout: ``clusterd --grpc-addr 127.0.0.1:99999``
listened on 34463, the port modulo 65536). One check in ``faultmesh.config.parse`` serves every
daemon and every source of a value (flag, ``FAULTMESH_*`` env, ``--config`` YAML)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from faultmesh import config


def _parsers():
    from clusterd.app import _load_component_classes
    from clusterd.app import build_parser as clusterd_parser
    from deviced.flags import build_parser as deviced_parser
    from noded.app import build_parser as noded_parser

    return {
        "clusterd": lambda: clusterd_parser(_load_component_classes()),
        "noded": noded_parser,
        "deviced": deviced_parser,
    }


BAD = [
    ("clusterd", ["--grpc-addr", "127.0.0.1:99999"], "--grpc-addr"),
    ("clusterd", ["--http-addr", "[::1]:70000"], "--http-addr"),
    ("clusterd", ["--grpc-addr", "127.0.0.1:-1"], "--grpc-addr"),
    ("noded", ["--node-name", "n", "--clusterd", "127.0.0.1:99999"], "--clusterd"),
    ("noded", ["--node-name", "n", "--bmc-host", "127.0.0.1", "--bmc-port", "70000"], "--bmc-port"),
    ("noded", ["--node-name", "n", "--http-addr", "127.0.0.1:65536"], "--http-addr"),
    ("deviced", ["--node-name", "n", "--backend", "sim", "--clusterd", "127.0.0.1:99999"], "--clusterd"),
    ("deviced", ["--node-name", "n", "--sim-control-addr", "127.0.0.1:99999"], "--sim-control-addr"),
]


@pytest.mark.parametrize("daemon, argv, flag", BAD)
def test_port_out_of_range_is_a_usage_error(daemon, argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        config.parse(_parsers()[daemon](), argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"argument {flag}:" in err and "Port out of range 0-65535" in err, err


def test_env_and_yaml_values_are_checked_too(tmp_path, monkeypatch, capsys):
    parser = _parsers()["clusterd"]
    monkeypatch.setenv("FAULTMESH_GRPC_ADDR", "127.0.0.1:99999")
    with pytest.raises(SystemExit) as e:
        config.parse(parser(), [])
    assert e.value.code == 2 and "--grpc-addr" in capsys.readouterr().err
    monkeypatch.delenv("FAULTMESH_GRPC_ADDR")
    (tmp_path / "c.yaml").write_text("http-addr: 0.0.0.0:123456\n")
    with pytest.raises(SystemExit) as e:
        config.parse(parser(), ["--config", str(tmp_path / "c.yaml")])
    assert e.value.code == 2 and "--http-addr" in capsys.readouterr().err


@pytest.mark.parametrize(
    "daemon, argv",
    [
        ("clusterd", ["--grpc-addr", "127.0.0.1:65535", "--http-addr", "[::1]:0"]),
        ("clusterd", ["--grpc-addr", "[::]:8899", "--http-addr", "localhost"]),
        (
            "noded",
            ["--node-name", "n", "--clusterd", "dns:///clusterd.mindx-dl.svc:8899", "--bmc-port", "623"],
        ),
        ("deviced", ["--node-name", "n", "--clusterd", "[fe80::1]"]),
    ],
)
def test_ports_in_range_and_targets_without_a_port_pass(daemon, argv):
    config.parse(_parsers()[daemon](), argv)


def test_check_port_bounds():
    assert config.check_port(0) == 0 and config.check_port("65535") == 65535
    for bad in (65536, -1, "x"):
        with pytest.raises(ValueError):
            config.check_port(bad)


def test_clusterd_exits_2_instead_of_listening_on_the_wrapped_port(tmp_path):
    cmd = [sys.executable, "-m", "clusterd", "--grpc-addr", "127.0.0.1:99999", "--state-dir", "st"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"clusterd started with port 99999: {e.stderr!r}")
    assert p.returncode == 2, p.stderr
    assert "argument --grpc-addr: '127.0.0.1:99999': Port out of range 0-65535" in p.stderr, p.stderr
