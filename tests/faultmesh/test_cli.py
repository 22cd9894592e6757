"""The operator CLI as a user meets it (issue 17): --version everywhere, shell completion, one job
spelling, -o table|wide|json|yaml through rich tables, exit codes that tell unreachable / rejected /
not found / bad usage apart, allowed values in errors, no Python reprs."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from support import cli_inproc as inproc
from support import make_clusterd

from faultmesh.model import Fault
from fmtools.cli import build_parser, main
from fmtools.cli.common import EXIT_NOT_FOUND, EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE, print_table

ROOT = Path(__file__).resolve().parents[2]


def fm(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services")}
    return subprocess.run(
        [sys.executable, "-m", "faultmesh", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        input=stdin,
    )


def test_version_on_the_cli_and_every_command(capsys):
    top = fm("--version")  # the console entry point itself, once
    assert top.returncode == 0 and top.stdout.startswith("faultmesh ")
    for argv in (["faults"], ["history"], ["job", "get"], ["slownode", "status"], ["stress-test"]):
        r = inproc(capsys, *argv, "--version")
        assert r.returncode == 0 and r.stdout == top.stdout, argv


def test_help_documents_exit_codes_and_completion_prints_shell_code(capsys):
    fm = functools.partial(inproc, capsys)
    r = fm("--help")
    assert r.returncode == 0
    for line in ("3  unreachable", "4  not found", "5  rejected", "2  bad usage"):
        assert line in r.stdout
    r = fm("completion", "bash")
    assert r.returncode == 0 and "complete" in r.stdout and "faultmesh" in r.stdout
    assert fm("completion", "tcsh").returncode == EXIT_USAGE


def test_one_job_spelling_with_hidden_aliases(capsys):
    fm = functools.partial(inproc, capsys)
    p = build_parser()
    for cmd in ("stress-test", "switch-nic", "trainsim"):
        extra = ["--nic", "n:0=on"] if cmd == "switch-nic" else []
        assert p.parse_args([cmd, "--job", "j1", *extra]).job_id == "j1"
        assert p.parse_args([cmd, "--job-id", "j1", *extra]).job_id == "j1"  # the old spelling still works
        h = fm(cmd, "--help").stdout
        assert "--job JOB" in h and "--job-id" not in h
    r = fm("stress-test", "--ops", "aic")
    assert r.returncode == EXIT_USAGE and "required: --job" in r.stderr


def test_bad_level_is_rejected_with_the_allowed_values(capsys):
    r = inproc(capsys, "faults", "--level", "Bogus")
    assert r.returncode == EXIT_USAGE
    assert "unknown level 'Bogus'" in r.stderr and "RestartNPU" in r.stderr and "SubHealthFault" in r.stderr
    assert "did you mean" not in r.stderr
    r = inproc(capsys, "faults", "--level", "RestrtNPU")  # issue 31: did-you-mean
    assert r.returncode == EXIT_USAGE and "(did you mean 'RestartNPU'" in r.stderr, r.stderr
    assert build_parser().parse_args(["faults", "--level", "subhealthfault"]).level == "SubHealthFault"


def test_explain_names_the_code_format(capsys):
    """issue 31: `explain 80E1800` (7 digits) was read as an unknown code; a code is 8 hex digits
    (9 for a public fault code)."""
    r = inproc(capsys, "explain", "80E1800")
    assert r.returncode == EXIT_USAGE and r.stdout == ""
    assert "CODE must be 8 hex digits" in r.stderr and "'80E1800'" in r.stderr, r.stderr
    assert inproc(capsys, "explain", "0x80E18008").returncode == 0
    assert inproc(capsys, "explain", "020001002").returncode == 0


def test_unreachable_is_exit_3_without_python_reprs(capsys):
    fm = functools.partial(inproc, capsys)
    for argv in (
        ["faults", "--http", "127.0.0.1:1"],
        ["pubfault", "send", "--grpc", "127.0.0.1:1", "--code", "010001001", "--node", "n", "--new-node"],
        ["pubfault", "send", "--http", "127.0.0.1:1", "--code", "010001001", "--node", "n"],  # the node check
    ):
        r = fm(*argv)
        assert r.returncode == EXIT_UNREACHABLE, (argv, r.stderr)
        assert "Error(" not in r.stderr and "URLError" not in r.stderr, r.stderr
    assert "Connection refused" in fm("faults", "--http", "127.0.0.1:1").stderr
    r = fm("pubfault", "send", "--http", "127.0.0.1:1", "--code", "010001001", "--node", "n")
    assert "--new-node skips the check" in r.stderr, r.stderr


def test_table_is_aligned_without_borders(capsys):
    print_table([("node-1", 3, None), ("n2", 12, "x [2]")], ("NODE", "FAULTS", "NOTE"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["NODE    FAULTS  NOTE", "node-1  3", "n2      12      x [2]"]


async def test_outputs_not_found_and_rejected_against_clusterd(tmp_path, capsys, monkeypatch):
    async def fm(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        """``faultmesh ARGS`` in-process, in a thread (clusterd runs on this loop)."""
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        rc = await asyncio.to_thread(main, list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), rc, out, err)

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cd = await make_clusterd(tmp_path, "--token-file", str(token))
    http = ["--http", f"127.0.0.1:{cd.http.port}"]
    try:
        await cd.center.upsert(
            Fault("deviced", "node-1", "NPU", 2, "80E18402", "SubHealthFault", attributes={"k": "v"})
        )
        r = await fm("faults", *http)
        assert r.returncode == 0 and r.stdout.split("\n")[0].split()[:3] == ["NODE", "DEVICE", "ID"]
        assert "ATTRIBUTES" not in r.stdout
        wide = await fm("faults", *http, "-o", "wide")
        assert "ATTRIBUTES" in wide.stdout and "k=v" in wide.stdout
        y = await fm("faults", *http, "-o", "yaml")
        j = await fm("faults", *http, "-o", "json")
        assert (
            yaml.safe_load(y.stdout) == json.loads(j.stdout) and json.loads(j.stdout)[0]["code"] == "80E18402"
        )
        r = await fm("faults", *http, "--node", "nosuch")  # tryout: was exit 0 with an empty table
        assert r.returncode == EXIT_NOT_FOUND and r.stdout == "", (r.returncode, r.stdout)
        assert r.stderr.count("\n") == 1 and "clusterd does not know node 'nosuch'" in r.stderr, r.stderr
        r = await fm("faults", *http, "--node", "node-1", "-o", "json")
        assert r.returncode == 0 and [f["node"] for f in json.loads(r.stdout)] == ["node-1"]
        r = await fm(
            "pubfault", "send", *http, "--grpc", f"127.0.0.1:{cd.grpc_port}", "--resource", "", "--code",
            "010001001", "--node", "node-1", "--token-file", str(token),
        )  # fmt: skip
        # the reference's 410 text, then what it means (tryout: the text alone did not say)
        assert r.returncode == EXIT_REJECTED and "410: limiter work by resource failed" in r.stderr, r.stderr
        assert "--resource '' is not in clusterd's public fault table" in r.stderr, r.stderr
        r = await fm("job", "get", "nope", *http)
        assert r.returncode == EXIT_NOT_FOUND and "job nope not found" in r.stderr
        assert (await fm("job", "get", "--job", "nope", *http)).returncode == EXIT_NOT_FOUND
        job = "id: j1\nname: bert\nranks:\n  - {rank: 0, node: node-1, device: 0}\n"
        r = await fm("job", "apply", "-f", "-", *http, stdin=job)
        assert r.returncode == EXIT_REJECTED and "bearer token required" in r.stderr  # no token given
        r = await fm("job", "apply", "-f", "-", *http, "--token-file", str(token), stdin=job)
        assert r.returncode == 0, r.stderr
        for action in ("get", "recovery"):  # the positional id and --job name the same job
            pos = await fm("job", action, "j1", *http, "-o", "json")
            flag = await fm("job", action, "--job", "j1", *http, "-o", "json")
            assert pos.returncode == flag.returncode == 0, (action, pos.stderr, flag.stderr)
            assert json.loads(pos.stdout) == json.loads(flag.stdout), action
    finally:
        await cd.stop()


def test_stress_test_outcome_reads_as_rows():
    from fmtools.cli.stress_test import result_rows

    msg = (
        "stress test find fault, isolate node:['node-b'],result:"
        '{"node-b":{"10":{"rankResult":{"1":{"code":"2","result":"hbm ecc"}}},"2":{"0":{"code":"7"}}}}'
    )
    head, rows = result_rows(msg)
    assert head == "stress test find fault, isolate node:['node-b']"
    assert rows == [
        ("node-b", "2", "aic", "7", "code '7' (not in the reference's table)", ""),
        ("node-b", "10", "p2p", "2", "fault found: the node is isolated", "hbm ecc"),
    ]
    for bad in ("stress test finish", "stress test finish, result:{not json", "x, result:[1]"):
        assert result_rows(bad) == (bad, [])


def test_stress_test_exits_1_when_an_op_failed_even_though_clusterd_says_finish():
    """Code "1" (test failed, training goes on) comes back as ``stress test finish`` (clusterd.md
    §4.2); the command's exit status is 1 unless every op answered "0" (tryout finding: rc 0 and
    ``"ok": true`` with every op failed)."""
    from fmtools.cli.stress_test import finished_clean

    failed = (
        'stress test finish,result:{"node-a":{"0":{"rankResult":{"0":{"code":"1","result":"aic fail"}}}}}'
    )
    clean = 'stress test finish,result:{"node-a":{"0":{"rankResult":{"0":{"code":"0"},"1":{"code":"0"}}}}}'
    assert not finished_clean(failed)
    assert finished_clean(clean)
    assert not finished_clean("stress test find fault, isolate node:['node-a'],result:{}")


async def test_cli_checks_node_names_codes_and_levels(tmp_path, capsys):
    """issue 31: a typo'd node in `pubfault send` is refused (exit 4) with the closest known names
    and makes no node; --new-node sends it; `history --node` and `nodes --node` of an unknown node
    are exit 4 like `faults --node`; a code outside the public table gets the closest codes."""

    async def fm(*args: str) -> subprocess.CompletedProcess:
        rc = await asyncio.to_thread(main, list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), rc, out, err)

    cd = await make_clusterd(tmp_path)
    http = ["--http", f"127.0.0.1:{cd.http.port}"]
    send = ["pubfault", "send", *http, "--grpc", f"127.0.0.1:{cd.grpc_port}", "--code", "020001001"]
    try:
        cd.nodes.hello("server-1", "10.0.0.1", "SN-1", "boot")
        cd.nodes.hello("server-2", "10.0.0.2", "SN-2", "boot")
        r = await fm(*send, "--node", "srever-1")
        assert r.returncode == EXIT_NOT_FOUND, (r.returncode, r.stderr)
        assert "clusterd does not know node 'srever-1' (did you mean 'server-1'" in r.stderr, r.stderr
        assert "--new-node" in r.stderr and r.stdout == ""
        names = [n["name"] for n in json.loads((await fm("nodes", *http, "-o", "json")).stdout)]
        assert names == ["server-1", "server-2"]  # the typo made no node
        r = await fm(*send, "--node", "server-1", "-o", "json")
        assert r.returncode == 0 and json.loads(r.stdout)["code"] == 0, r.stderr
        r = await fm(*send, "--node", "server-3", "--new-node")
        assert r.returncode == 0, r.stderr
        r = await fm("nodes", *http, "--node", "server-3", "-o", "json")
        assert r.returncode == 0 and [n["name"] for n in json.loads(r.stdout)] == ["server-3"], r.stderr
        r = await fm("nodes", *http, "--node", "server-1")
        assert r.returncode == 0 and r.stdout.splitlines()[1].split()[0] == "server-1"
        assert len(r.stdout.splitlines()) == 2
        r = await fm("nodes", *http, "--node", "server-9")
        assert r.returncode == EXIT_NOT_FOUND and "clusterd does not know node 'server-9'" in r.stderr
        r = await fm("history", *http, "--node", "server-9")  # tryout: exit 0 with an empty table
        assert r.returncode == EXIT_NOT_FOUND and "did you mean" in r.stderr and r.stdout == "", r.stderr
        assert (await fm("history", *http, "--node", "server-2")).returncode == 0  # known, nothing kept
        r = await fm("history", *http, "--node", "server-1", "-o", "json")
        assert r.returncode == 0 and {e["code"] for e in json.loads(r.stdout)} == {"020001001"}
        r = await fm(*send[:-1], "010001009", "--node", "server-1")  # not in the public fault table
        assert r.returncode == EXIT_REJECTED and "is not in faultmesh's public fault table" in r.stderr
        assert "'010001004'" in r.stderr.split("did you mean", 1)[1], r.stderr
    finally:
        await cd.stop()


def test_slownode_status_rows_name_the_rule_its_top_score_and_the_sequential_statistic():
    """What an operator reads per node (docs/slownode.md): the highest rank score of the peer rules
    (>= 1 flags) with the rule's key, and the highest sequential statistic against seqBound."""
    from fmtools.cli.slownode import _top_score, _top_seq

    r = {"gapExcess": {}, "dpLag": {"2": 1.9, "3": -1.9}, "seqStat": {"1": 4.9, "2": 0.5}}
    assert _top_score(r) == "rank 2 dpLag 1.90"
    assert _top_seq(r, 6.0) == "rank 1 4.9/6"
    assert _top_score({}) == "-" and _top_seq({}, 6.0) == "-"
