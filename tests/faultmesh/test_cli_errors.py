"""Bad input and unusable paths give one clear line and the documented exit code (README: 1 failed,
2 bad usage, 3 unreachable, 4 not found, 5 rejected), never a Python traceback (new-user tryout)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from faultmesh.cli import main
from faultmesh.cli.common import EXIT_USAGE


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


def test_up_bad_run_dir_and_sizes_are_usage(capsys, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, err = cli(capsys, "up", "--run-dir", str(blocker / "sub"))  # a file where a folder must be
    assert rc == EXIT_USAGE and "--run-dir" in err
    for argv in (["--servers", "0"], ["--npus", "7"]):
        rc, err = cli(capsys, "up", "--run-dir", str(tmp_path / "r"), *argv)
        assert rc == EXIT_USAGE and "--npus a multiple of 8" in err


def test_demo_bad_run_dir_is_usage(capsys, tmp_path: Path):
    from faultmesh.demo.__main__ import main as demo_main

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
