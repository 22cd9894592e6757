"""A noded restart is invisible (issue 30) with ``--bmc-state-file``: a BMC alarm active before
SIGTERM and shown by the first poll after the start keeps its first-seen time in noded's own view and
in clusterd, with no recover/occur pair in clusterd's history; an alarm cleared while noded was down
is one recover, and the file forgets it. A corrupt state file: noded starts with no kept times, says
so once, counts it, keeps the bad file aside -- and the alarm is reported as usual."""

from __future__ import annotations

import json

from support import ClusterdProcess, NodedProcess, wait_for

CODE = "0800004B"  # iBMC alarm (top byte 0x08: a PCIe card), PreSeparateFault


def noded(tmp_path, bmc_sim, cd, state_file):
    return NodedProcess(
        tmp_path, "node-b", cd.grpc,
        "--bmc-host", "127.0.0.1", "--bmc-port", str(bmc_sim.port), "--bmc-user", bmc_sim.user,
        "--bmc-password-file", str(bmc_sim.password_file), "--poll-interval", "1",
        "--bmc-state-file", str(state_file), "--min-report-interval", "0.3",
    )  # fmt: skip


def polls_ok(nd: NodedProcess) -> float:
    for line in nd.metrics().splitlines():
        if line.startswith('faultmesh_noded_bmc_polls_total{result="ok"}'):
            return float(line.split()[-1])
    return 0.0


def first_seen(nd: NodedProcess) -> int | None:
    got = [f["first_seen_ms"] for f in nd.get_json("/v1/state")["faults"] if f["code"] == CODE]
    return got[0] if got else None


def events(cd) -> list[str]:
    return [e["kind"] for e in cd.get_json(f"/v1/events?node=node-b&code={CODE}")]


def test_restart_keeps_first_seen_and_a_recover_while_down_counts_once(tmp_path, bmc_sim):
    state_file = tmp_path / "noded-bmc.json"
    cd = ClusterdProcess(tmp_path / "state").start()
    nd = noded(tmp_path, bmc_sim, cd, state_file)
    try:
        bmc_sim.add_alarm(CODE, "Memory", 3)
        nd.start()
        t1 = wait_for(lambda: first_seen(nd), what="the alarm in noded")
        level = wait_for(
            lambda: [f["level"] for f in cd.get_json("/v1/faults") if f["code"] == CODE], what="clusterd"
        )
        wait_for(lambda: state_file.exists() and json.loads(state_file.read_text())["faults"], what="file")
        for _ in range(2):
            nd.stop()
            nd.start()
            wait_for(lambda: polls_ok(nd) >= 2, what="two polls after the restart")
            assert first_seen(nd) == t1
            faults = [f for f in cd.get_json("/v1/faults") if f["code"] == CODE]
            assert [(f["level"], f["first_seen_ms"]) for f in faults] == [(level[0], t1)]
        assert events(cd) == ["occur"]
        nd.stop()
        bmc_sim.clear_alarms()  # it recovers while noded is down
        nd.start()
        wait_for(lambda: events(cd) == ["occur", "recover"], what="one recover in clusterd")
        wait_for(lambda: json.loads(state_file.read_text())["faults"] == {}, what="the file forgets it")
        wait_for(lambda: polls_ok(nd) >= 3, what="more polls")
        assert events(cd) == ["occur", "recover"]
    finally:
        nd.stop()
        cd.stop()


def test_corrupt_state_file_starts_empty_once_counted(tmp_path, bmc_sim):
    state_file = tmp_path / "noded-bmc.json"
    state_file.write_text('{"version": 1, "faults": {"bmc-oem|Memory|3|0800004B": 17')  # truncated
    cd = ClusterdProcess(tmp_path / "state").start()
    nd = noded(tmp_path, bmc_sim, cd, state_file)
    try:
        bmc_sim.add_alarm(CODE, "Memory", 3)
        nd.start()
        wait_for(lambda: first_seen(nd), what="the alarm reported as usual")
        assert first_seen(nd) > 17
        metric = 'faultmesh_noded_state_file_rejected_total{reason="corrupt"} 1.0'
        assert metric in nd.metrics()
        assert nd.log_text().count("state file rejected, starting with empty state") == 1
        assert (tmp_path / "noded-bmc.json.corrupt").read_text().endswith(": 17")
        wait_for(lambda: json.loads(state_file.read_text())["faults"], what="a good file written again")
        # noded's view and file come first; clusterd has it once the stream delivered it
        levels = wait_for(
            lambda: [f["level"] for f in cd.get_json("/v1/faults") if f["code"] == CODE], what="clusterd"
        )
        assert levels == ["PreSeparateFault"]
    finally:
        nd.stop()
        cd.stop()
