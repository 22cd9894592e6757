"""Bad input and unusable paths give one clear line and the documented exit code (README: 1 failed,
2 bad usage, 3 unreachable, 4 not found, 5 rejected), never a Python traceback (new-user tryout)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from support import make_clusterd

from fmtools.cli import main
from fmtools.cli.common import EXIT_NOT_FOUND, EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE


def cli(capsys, *argv: str) -> tuple[int, str]:
    """``faultmesh ARGV`` in-process: (exit status, stderr). argparse's exits are caught."""
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


@pytest.fixture
def not_utf8(tmp_path: Path) -> Path:
    p = tmp_path / "latin1.json"
    p.write_bytes(b'{"jobName": "caf\xe9"}')
    return p


def test_job_apply_unreadable_or_bad_file_is_usage(capsys, tmp_path: Path, not_utf8: Path):
    http = ["--http", "127.0.0.1:1"]  # never reached: the file is checked first
    rc, err = cli(capsys, "job", "apply", "-f", str(not_utf8), *http)
    assert rc == EXIT_USAGE and "not UTF-8" in err and str(not_utf8) in err
    rc, err = cli(capsys, "job", "apply", "-f", str(tmp_path / "missing.yaml"), *http)
    assert rc == EXIT_USAGE and "No such file" in err
    bad = tmp_path / "bad.json"
    bad.write_text("{x")
    rc, err = cli(capsys, "job", "apply", "-f", str(bad), *http)
    assert rc == EXIT_USAGE and str(bad) in err


def test_a_job_file_larger_than_clusterd_takes_is_refused_before_parsing(capsys, tmp_path: Path):
    # a 300 MB whitespace file took 6.5 min of CPU in the YAML parser before 'no job' (tryout)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(300 << 20)  # sparse: instant to make, refused after reading 16 MiB + 1
    rc, err = cli(capsys, "job", "apply", "-f", str(big), "--http", "127.0.0.1:1")
    assert rc == EXIT_USAGE and "is larger than 16 MiB, the most clusterd takes in one request" in err, err


def test_slownode_conf_not_utf8_or_not_json_is_usage(capsys, tmp_path: Path, not_utf8: Path):
    http = ["--http", "127.0.0.1:1"]
    rc, err = cli(capsys, "slownode", "enable", "--job", "j", "--conf", str(not_utf8), *http)
    assert rc == EXIT_USAGE and "not UTF-8" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"FeatConf": "{nope"}')
    rc, err = cli(capsys, "slownode", "enable", "--job", "j", "--conf", str(bad), *http)
    assert rc == EXIT_USAGE and "not JSON" in err
    rc, err = cli(capsys, "slownode", "enable", "--job", "j", "--ranks", "{", *http)
    assert rc == EXIT_USAGE and "--ranks" in err


def test_slownode_enable_names_a_featconf_key_clusterd_will_ignore(capsys, tmp_path: Path):
    """A misspelt key was taken silently (clusterd only logs that it ignored it): the CLI says so,
    with the closest key, before it sends (here to no clusterd: exit 3 after the warning)."""
    conf = tmp_path / "featconf.json"
    conf.write_text('{"jobName": "j", "dpLongSpred": 2, "seqBound": 6}')
    rc, err = cli(capsys, "slownode", "enable", "--job", "j", "--conf", str(conf), "--http", "127.0.0.1:1")
    assert rc == EXIT_UNREACHABLE
    assert (
        "warning: FeatConf key 'dpLongSpred' is not known and is ignored (did you mean 'dpLongSpread' or"
        in err
    )
    assert "seqBound" not in err


def test_up_bad_run_dir_and_sizes_are_usage(capsys, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, err = cli(capsys, "up", "--run-dir", str(blocker / "sub"))  # a file where a folder must be
    assert rc == EXIT_USAGE and "--run-dir" in err
    for argv in (["--servers", "0"], ["--npus", "7"]):
        rc, err = cli(capsys, "up", "--run-dir", str(tmp_path / "r"), *argv)
        assert rc == EXIT_USAGE and "--npus a multiple of 8" in err


def test_demo_bad_run_dir_is_usage(capsys, tmp_path: Path):
    from fmtools.demo.__main__ import main as demo_main

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as e:
        demo_main(["--run-dir", str(blocker / "sub")])
    assert e.value.code == EXIT_USAGE
    assert "--run-dir" in capsys.readouterr().err


@pytest.fixture
def root_logging():
    """clusterd's main configures the root logger: put it back afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    yield
    for h in root.handlers:
        if h not in saved[0]:
            h.close()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_clusterd_bad_state_dir_token_file_or_log_file_fails_cleanly(capsys, root_logging, tmp_path: Path):
    from clusterd.app import main as clusterd_main

    blocker = tmp_path / "file"
    blocker.write_text("")
    addrs = ["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"]
    assert clusterd_main(["--state-dir", str(blocker / "state"), *addrs]) == 1
    err = capsys.readouterr().err
    assert "clusterd failed to start" in err and "--state-dir" in err
    missing = tmp_path / "missing-token"
    assert clusterd_main(["--state-dir", str(tmp_path / "st"), "--token-file", str(missing), *addrs]) == 1
    err = capsys.readouterr().err
    assert "clusterd failed to start" in err and str(missing) in err
    with pytest.raises(SystemExit) as e:
        clusterd_main(["--log-file", str(blocker / "x.log"), *addrs])
    assert e.value.code == EXIT_USAGE and "--log-file" in capsys.readouterr().err
    empty = tmp_path / "empty-token"
    empty.write_text("\n")  # an empty mounted Secret: refused, never "authentication off"
    assert clusterd_main(["--state-dir", str(tmp_path / "st2"), "--token-file", str(empty), *addrs]) == 1
    assert "clusterd failed to start" in (err := capsys.readouterr().err) and "is empty" in err, err
    rc, err = cli(capsys, "nodes", "--token-file", str(empty))
    assert rc == EXIT_USAGE and "is empty" in err


async def _cli_async(capsys, *argv: str) -> tuple[int, str]:
    """:func:`cli` in a thread (the blocking gRPC / HTTP calls) while the in-process clusterd runs."""
    rc = await asyncio.to_thread(main, list(argv))
    return rc, capsys.readouterr().err


async def test_unknown_job_is_not_found_and_the_rate_limit_is_rejected(capsys, tmp_path: Path):
    cd = await make_clusterd(tmp_path)
    at = ["--grpc", f"127.0.0.1:{cd.grpc_port}", "--http", f"127.0.0.1:{cd.http.port}"]
    try:
        rc, err = await _cli_async(capsys, "stress-test", "--job", "nojob", "--no-wait", *at)
        assert rc == EXIT_NOT_FOUND and "code 413" in err and "job:nojob not exist" in err
        rc, err = await _cli_async(
            capsys, "switch-nic", "--job", "nojob", "--nic", "n:0=on", "--no-wait", *at
        )
        assert rc == EXIT_NOT_FOUND and "not exist" in err
        rc, err = await _cli_async(capsys, "trace", "get", "--job", "default/nojob", *at)
        assert rc == EXIT_NOT_FOUND and "failed to found configmap" in err
        # tryout: 'trace on' of an unknown job was 'UNKNOWN: notify subscribe failed', rc 1
        rc, err = await _cli_async(capsys, "trace", "on", "--job", "default/nojob", *at)
        assert rc == EXIT_NOT_FOUND and "notify subscribe failed" in err
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path / "limited", "--unary-qps", "0.5")  # burst 0.5: every call refused
    at = ["--grpc", f"127.0.0.1:{cd.grpc_port}"]
    try:
        rc, err = await _cli_async(capsys, "trace", "get", "--job", "default/j", *at)
        assert rc == EXIT_REJECTED and "qps exceeded" in err
    finally:
        await cd.stop()


async def test_pubfault_to_a_silent_address_is_unreachable(capsys):
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # takes TCP, never answers
    port = server.sockets[0].getsockname()[1]
    try:
        rc, err = await _cli_async(
            capsys, "pubfault", "send", "--grpc", f"127.0.0.1:{port}", "--timeout-s", "0.5",
            "--code", "010001001", "--node", "n", "--new-node",
        )  # fmt: skip
        assert rc == EXIT_UNREACHABLE and "no answer in time" in err
    finally:
        server.close()
        await server.wait_closed()


def test_pubfault_code_and_devices_are_checked_before_sending(capsys):
    grpc_addr = ["--grpc", "127.0.0.1:1"]  # never reached
    for code in ("01000100", "0100010010", "01000100Z"):
        rc, err = cli(capsys, "pubfault", "send", *grpc_addr, "--code", code, "--node", "n")
        assert rc == EXIT_USAGE and "--code must be 9 hex digits" in err, code
    for devices in ("32", "-1", "1,1", ""):
        rc, err = cli(
            capsys, "pubfault", "send", *grpc_addr, "--code", "010001001", "--node", "n", "--devices", devices
        )
        assert rc == EXIT_USAGE and "[0, 31]" in err, devices
    rc, err = cli(
        capsys, "pubfault", "send", *grpc_addr, "--code", "0A0001001", "--node", "n", "--devices", "0,31",
        "--new-node",
    )  # fmt: skip
    assert rc == EXIT_UNREACHABLE  # valid: it was sent (to nobody)


def test_release_npu_without_phy_id_is_usage(capsys):
    rc, err = cli(capsys, "release", "npu", "node-1", "--http", "127.0.0.1:1")
    assert rc == EXIT_USAGE and "NODE/PHYID" in err


def test_unknown_flag_after_a_command_shows_that_commands_usage(capsys):
    rc, err = cli(capsys, "nodes", "--device", "x")
    assert rc == EXIT_USAGE and err.startswith("usage: faultmesh nodes ")
    assert "faultmesh nodes: error: unrecognized arguments: --device x" in err
    rc, err = cli(capsys, "release", "npu", "--node", "x")
    assert rc == EXIT_USAGE and err.startswith("usage: faultmesh release npu ") and "NODE/PHYID" in err
    rc, err = cli(capsys, "--bogus")  # no command: the top-level usage
    assert rc == EXIT_USAGE and err.startswith("usage: faultmesh [-h]")


async def _answering(body: bytes):
    """A TCP server that answers every connection with ``body`` and closes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(body)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_faults_at_a_grpc_port_or_a_foreign_web_server_is_a_short_clear_error(capsys, tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        faults = await _cli_async(capsys, "faults", "--http", f"127.0.0.1:{cd.grpc_port}")
        sim = await _cli_async(capsys, "device-sim", "--sim", f"127.0.0.1:{cd.grpc_port}", "devices")
        bmc = await _cli_async(capsys, "bmc-sim", "status", "--control", f"127.0.0.1:{cd.grpc_port}")
    finally:
        await cd.stop()
    for rc, err in (faults, sim, bmc):  # one HTTP client for clusterd and the simulators
        assert rc == EXIT_UNREACHABLE and "not HTTP/1.x (is it a gRPC port?)" in err
        assert "\x00" not in err and len(err) < 200, err
    page = b"<!DOCTYPE HTML>\n<html><head><title>Error response</title></head><body>404</body></html>\n" * 5
    head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(page)
    binary = bytes(range(256))
    bhead = b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(binary)
    for answer, code, text in (
        (head + page, EXIT_NOT_FOUND, "an HTML page, not a faultmesh answer"),
        (bhead + binary, 1, "bytes that are not text"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            EXIT_UNREACHABLE,
            "not JSON: is it clusterd's",
        ),
    ):
        server = await _answering(answer)
        try:
            rc, err = await _cli_async(
                capsys, "faults", "--http", f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
            )
        finally:
            server.close()
            await server.wait_closed()
        assert rc == code and text in err and "<html" not in err and len(err) < 200, err


def test_every_token_file_flag_reads_the_same_env(capsys, monkeypatch, tmp_path):
    from fmtools.cli import build_parser

    tok = tmp_path / "tok"
    monkeypatch.setenv("FAULTMESH_TOKEN_FILE", str(tok))
    args = build_parser().parse_args(["device-sim", "fault", "0", "80E18008"])
    assert args.token_file == str(tok)
    with pytest.raises(SystemExit):
        main(["device-sim", "--help"])
    out = capsys.readouterr().out
    assert "FAULTMESH_TOKEN_FILE" in out and "(env FAULTMESH_TOKEN)" not in out


def test_an_address_that_is_not_one_is_usage(capsys):
    rc, err = cli(capsys, "faults", "--http", "http://[bad")
    assert rc == EXIT_USAGE and "bad address 'http://[bad'" in err
    # no host, a port that is no number, a ':' with no port: usage, not "unreachable" (tryout)
    for addr, why in (("", "no host"), ("127.0.0.1:notaport", "Port could not be cast"), ("h:", "no port")):
        rc, err = cli(capsys, "nodes", "--http", addr)
        assert rc == EXIT_USAGE and f"bad address {addr!r}" in err and why in err, (addr, err)
    rc, err = cli(capsys, "pubfault", "send", "--timeout-s", "-1", "--code", "010001001", "--node", "n1")
    assert rc == EXIT_USAGE and "'-1' is not a positive number" in err


def test_a_bare_port_is_usage_naming_host_port(capsys, monkeypatch):
    """issue 31 tryout: `--http 8080` was read as the host "8080" on port 80 (a slow 'unreachable')."""
    for argv in (("faults", "--http", "8080"), ("jobs", "--grpc", "8899"), ("nodes", "--http", " 80 ")):
        rc, err = cli(capsys, *argv)
        assert rc == EXIT_USAGE and "is a port alone: give host:port (e.g. 127.0.0.1:" in err, (argv, err)
    monkeypatch.setenv("FAULTMESH_HTTP_ADDR", "8080")  # the env default is checked the same way
    rc, err = cli(capsys, "faults")
    assert rc == EXIT_USAGE and "give host:port" in err, err


def test_history_since_is_checked_before_asking(capsys):
    # tryout: 'history --since forever' was rc 3 with clusterd down and rc 5 with it up
    rc, err = cli(capsys, "history", "--since", "forever", "--http", "127.0.0.1:1")
    assert rc == EXIT_USAGE and "use a duration (30m, 12h, 2d)" in err
    rc, _ = cli(capsys, "history", "--since", "2d", "--http", "127.0.0.1:1")
    assert rc == EXIT_UNREACHABLE  # a good value goes on to the (absent) server


@pytest.mark.parametrize(
    "argv",
    [
        ["--link-recover", "-5"],  # tryout: ran 96 s, then the escalation row was MISSING
        ["--link-down", "0"],
        ["--bmc-poll", "0"],
        ["--list-watch", "2"],
        ["--slow-after-steps", "-1"],
        ["--log-level", "LOUD"],
    ],
)
def test_demo_bad_intervals_are_usage_before_anything_starts(capsys, tmp_path: Path, argv):
    from fmtools.demo.__main__ import main as demo_main

    with pytest.raises(SystemExit) as e:
        demo_main(["--run-dir", str(tmp_path / "r"), *argv])
    assert e.value.code == EXIT_USAGE
    assert argv[0] in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing was started


def test_up_bad_poll_and_log_level_are_usage(capsys, tmp_path: Path):
    # tryout: 'up --bmc-poll 0' / '--log-level LOUD' started the stack and failed 12 s later, rc 1
    for argv in (["--bmc-poll", "0"], ["--log-level", "LOUD"], ["--list-watch", "9999"]):
        rc, err = cli(capsys, "up", "--run-dir", str(tmp_path / "r"), *argv)
        assert rc == EXIT_USAGE and argv[0] in err, err


def test_a_missing_job_names_the_command_that_needs_it(capsys):
    # tryout: 'jobs reset' without a job said 'faultmesh job ACTION JOB'; 'slownode disable' took
    # only --job while 'slownode status' takes the job as an argument
    for argv, said in (
        (["jobs", "reset"], "faultmesh jobs reset JOB"),
        (["job", "get"], "faultmesh job get JOB"),
        (["slownode", "disable"], "faultmesh slownode disable JOB"),
    ):
        rc, err = cli(capsys, *argv, "--http", "127.0.0.1:1")
        assert rc == EXIT_USAGE and said in err, err
    rc, _ = cli(capsys, "slownode", "disable", "job1", "--http", "127.0.0.1:1")
    assert rc == EXIT_UNREACHABLE  # the job as an argument goes on to the (absent) server


def test_an_empty_address_env_means_the_default(capsys, monkeypatch):
    # tryout: FAULTMESH_HTTP_ADDR= gave a 'no host' error instead of the default address
    monkeypatch.setenv("FAULTMESH_HTTP_ADDR", "")
    rc, err = cli(capsys, "faults")
    # unreachable on 127.0.0.1:8080 (or answered, if something there is a clusterd): not a usage error
    assert rc in (0, EXIT_UNREACHABLE) and "no host" not in err, err
    assert rc == 0 or "127.0.0.1:8080" in err, err


@pytest.mark.parametrize("argv", [["--drop", "maybe"], ["--delay", "-3"]])
def test_bmc_sim_behave_bad_values_are_usage(capsys, argv):
    # tryout: '--drop maybe' was taken as false, '--delay -3' accepted
    rc, err = cli(capsys, "bmc-sim", "behave", *argv, "--control", "127.0.0.1:1")
    assert rc == EXIT_USAGE and argv[0] in err, err
