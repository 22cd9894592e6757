"""The demo's own parts: the summary verdicts, the link rule table it gives deviced, the slow-network
link localization it reads, and the process group that must leave nothing running."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from fmtools.demo.__main__ import build_parser, link_rule_table
from fmtools.demo.procs import ProcessGroup
from fmtools.demo.report import MISSING, NOT_AVAILABLE, RIGHT, WRONG, Clock, Row, all_right, table
from fmtools.demo.scenario import _link_ends, _stress_brief


def test_summary_fails_on_anything_but_right():
    clock = Clock()
    ok = Row("a", injected=clock.t0 + 1, detected=clock.t0 + 3.5, decided="x", verdict=RIGHT)
    assert all_right([ok])
    assert not all_right([])
    for bad in (WRONG, MISSING, NOT_AVAILABLE):
        assert not all_right([ok, Row("b", verdict=bad)])
    text = table([ok, Row("b", verdict=NOT_AVAILABLE, note="part missing")], clock)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["#", "fault", "injected"]
    assert lines[2].rstrip().endswith("RIGHT") and "2.5 s" in lines[2] and "(+1.0s)" in lines[2]
    assert lines[3].rstrip().endswith("NOT AVAILABLE")
    assert "  #2: part missing" in lines


def test_link_rule_table_keeps_the_rules_and_sets_recover_timeout():
    table_ = link_rule_table(10)
    rules = [r for r in table_["FaultDuration"] if "81078603" in r["EventId"]]
    assert rules == [
        {"EventId": ["81078603"], "FaultTimeout": 20, "RecoverTimeout": 10, "FaultHandling": "PreSeparateNPU"}
    ]
    assert table_["FaultFrequency"]  # the other rules stay
    assert link_rule_table(60)["FaultDuration"][0]["RecoverTimeout"] == 60


def test_defaults_are_the_real_rules():
    a = build_parser().parse_args([])
    assert (a.link_down, a.link_recover, a.pingmesh_period, a.slow_mode) == (25.0, 60.0, 0.0, "sleep")


def test_link_ends_from_slownet_alarms():
    alarm = {"kind": "link", "node": "server-2", "phyId": 1, "peerNode": "server-2", "peerPhyId": 6}
    f = {"attributes": {"alarms": json.dumps([alarm])}}
    assert _link_ends(f) == {("server-2", 1), ("server-2", 6)}
    assert _link_ends({"attributes": {"alarms": "not json"}}) == set()
    assert _link_ends({"attributes": {"alarms": json.dumps([dict(alarm, kind="npu")])}}) == set()


def test_stress_brief():
    msg = 'stress test finish, result:{"n":{"2":{"0":{"code":"0","result":"ok"},"1":{"code":"2"}}}}'
    assert _stress_brief(msg) == "stress test finish: 2 op results, codes ['0', '2']"
    assert _stress_brief("pause train timeout") == "pause train timeout"
    ref = 'stress test finish, result:{"n":{"2":{"rankResult":{"0":{"code":"0","result":"ok"}}}}}'
    assert _stress_brief(ref) == "stress test finish: 1 op results, codes ['0']"


async def test_stop_reaches_grandchildren(tmp_path):
    """A child that spawned its own process (like the PyTorch job's ranks) is stopped with it."""
    group = ProcessGroup(tmp_path / "logs")
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    child = await group.start("parent", [sys.executable, "-c", code])
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    grandchild = int(pid_file.read_text())
    os.kill(grandchild, 0)  # alive
    await group.stop_all(grace_s=2)
    assert not child.alive and group.dead() == []
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the grandchild survived")
    assert (tmp_path / "logs" / "parent.log").read_text().startswith("# ")


async def test_children_die_with_a_killed_orchestrator(tmp_path):
    """``faultmesh up`` / the demo killed with SIGKILL (no chance to stop its children): every child
    gets SIGTERM from the kernel (PR_SET_PDEATHSIG) instead of running on (a helper's killed test
    run left a clusterd, noded, deviced and bmc-sim running for an hour)."""
    pid_file = tmp_path / "child.pid"
    code = (
        "import asyncio, pathlib, sys, time\n"
        "from fmtools.demo.procs import ProcessGroup\n"
        "async def main():\n"
        f"    g = ProcessGroup(pathlib.Path({str(tmp_path / 'logs')!r}))\n"
        "    c = await g.start('sleeper', [sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"    pathlib.Path({str(pid_file)!r}).write_text(str(c.pid))\n"
        "    await asyncio.sleep(300)\n"
        "asyncio.run(main())\n"
    )
    orchestrator = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text():
                break
            await asyncio.sleep(0.05)
        child = int(pid_file.read_text())
        os.kill(child, 0)  # alive
    finally:
        orchestrator.kill()
        await orchestrator.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError("the child outlived its killed orchestrator")


async def test_a_failing_step_marks_only_its_own_rows_wrong():
    from fmtools.demo.scenario import Scenario, Timing

    sc = Scenario(stack=None, clock=Clock(), timing=Timing())  # the steps below do not touch the stack

    async def good():
        r = sc.h.row("good")
        await asyncio.sleep(0.2)
        r.verdict = RIGHT

    async def bad():
        sc.h.row("bad")
        await asyncio.sleep(0.1)
        raise KeyError("boom")

    await asyncio.gather(sc.h.step_at(0, bad), sc.h.step_at(0.05, good))
    assert [(r.fault, r.verdict) for r in sc.rows] == [("bad", WRONG), ("good", RIGHT)]
    assert "KeyError('boom')" in sc.rows[0].note


def test_free_ports_are_never_handed_out_twice(monkeypatch):
    """The OS gave the same port to two bind-to-0 calls in a row, and the demo gave a BMC
    simulator's control port to server-2's noded too (it exited with 'address already in use')."""
    from fmtools.demo import procs

    ports = iter([41803, 41803, 41804])

    class Sock:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def bind(self, addr):
            pass

        def getsockname(self):
            return ("127.0.0.1", next(ports))

    monkeypatch.setattr(procs.socket, "socket", Sock)
    monkeypatch.setattr(procs, "_GIVEN", set())
    assert [procs.free_port(), procs.free_port()] == [41803, 41804]
