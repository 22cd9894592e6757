"""The example training job across hosts (issue 29): launched by torchrun as two nodes (two
``torch.distributed.run`` agents, ``--nnodes 2``, one per "host", meeting at ``--master-addr``), each
process is the rank torchrun gives it and the ranks train together; a bad torchrun variable is a
usage error naming it. The single-host default (the job spawns ``--ranks`` itself) is what the demo
and tests/e2e run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import free_port

from faultmesh.profiler.launch import Rendezvous, gloo_interface, rendezvous

JOB = [
    "-m", "faultmesh.profiler.example_job", "--tp", "1", "--steps", "3", "--warmup", "3", "--batch", "64",
    "--layers", "1", "--tp-elems", "16",
]  # fmt: skip
CLEAN = {
    k: v
    for k, v in os.environ.items()
    if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
}


def test_the_torchrun_environment_is_read():
    assert rendezvous({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4",
                       "LOCAL_RANK": "1"}) == Rendezvous("10.0.0.1", 29500, 3, 4, 1)  # fmt: skip
    alone = rendezvous({})
    assert alone.master_addr == "127.0.0.1" and alone.master_port > 0 and alone.rank is None
    for env, word in (
        ({"RANK": "0"}, "RANK and WORLD_SIZE come together"),
        ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_PORT": "1"}, "RANK=4 is not below WORLD_SIZE=4"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_PORT is needed"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ):
        with pytest.raises(ValueError, match=word):
            rendezvous(env)


def test_gloo_interface_is_none_on_one_host_or_an_unknown_master():
    """Across hosts the job sets GLOO_SOCKET_IFNAME to the interface toward MASTER_ADDR (checked
    with real hosts in tests/e2e/test_multihost.py); on one host, or when the master cannot be
    resolved, gloo is left to its default."""
    assert gloo_interface("127.0.0.1", 29500) is None
    assert gloo_interface("no-such-host.invalid", 29500) is None


def test_a_bad_torchrun_variable_is_a_usage_error(tmp_path):
    env = {**CLEAN, "RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "1"}
    cmd = [sys.executable, *JOB, "--base-dir", str(tmp_path), "--task-id", "j"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and "RANK='x': expected an integer" in p.stderr, p.stderr


def test_two_hosts_launched_by_torchrun_train_together(tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install '.[torch]')")
    port = free_port()
    summary = tmp_path / "summary"
    procs = []
    for node_rank in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            *JOB, "--base-dir", str(tmp_path / f"host{node_rank}"), "--task-id", "job-1",
            "--summary", str(summary), "--slow-mode", "none",
        ]  # fmt: skip
        log = open(tmp_path / f"host{node_rank}.log", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=CLEAN), log))
    try:
        for p, _ in procs:
            p.wait(240)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            log.close()
    logs = [(tmp_path / f"host{n}.log").read_text(errors="replace") for n in (0, 1)]
    assert [p.returncode for p, _ in procs] == [0, 0], logs
    assert "finished after 3 steps" in logs[0]
    ranks = {json.loads((summary / f"rank{r}.json").read_text())["rank"] for r in (0, 1)}
    assert ranks == {0, 1}
    # each host's profiling records carry the global rank torchrun gave its process
    assert (tmp_path / "host0" / "job-1" / "0").is_dir() and (tmp_path / "host1" / "job-1" / "1").is_dir()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--ranks", "0"], "argument --ranks: '0' is not a positive integer"),
        (["--bucket-mb", "-1"], "argument --bucket-mb: '-1' is not a positive number"),
        (["--factor", "-1"], "argument --factor: '-1' is not a number >= 0"),
        (["--warmup", "2"], "--warmup 2: at least 3 steps"),
        (["--slow-mode", "compute", "--slow-rank", "4"], "--slow-rank 4: not a rank of the job's 4 (0..3)"),
        (["--ranks", "3", "--tp", "2"], "--tp 2: the job's 3 ranks do not split into TP groups of 2"),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_it(flags, says, capsys):
    """A value the job cannot run with (it ran nothing and exited 0, or trained with a negative
    slowdown) is exit 2 with the flag and the allowed values, before any rank starts."""
    from faultmesh.profiler.example_job import main

    with pytest.raises(SystemExit) as e:
        main(["--base-dir", "/nonexistent", "--task-id", "t", *flags])
    assert e.value.code == 2 and says in capsys.readouterr().err
