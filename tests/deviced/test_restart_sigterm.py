"""The issue-30 case on the real daemons: deviced (``--state-file``, sim backend) sees 80E18008 once on
NPU 5 (RestartNPU), gets SIGTERM and starts again on the same state file while the chip still has the
fault. The simulated chips live in deviced's process, so the restarted daemon's first poll finds them
empty and the fault comes back through the driver's callback a moment later (re-injected through the
sim API) -- the same occurrence: RestartNPU kept, the state file holds one occurrence, clusterd's
history holds no recover/occur pair and its first-seen time is unchanged."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

from support import ClusterdProcess, free_port, wait_for, wait_http

HBM = "80E18008"


class Deviced:
    def __init__(self, tmp_path, clusterd: ClusterdProcess) -> None:
        self.http = f"127.0.0.1:{free_port()}"
        self.state_file = tmp_path / "deviced-state.json"
        self.cmd = [
            sys.executable, "-m", "deviced", "--node-name", "node-r", "--clusterd", clusterd.grpc,
            "--backend", "sim", "--http-addr", self.http, "--state-file", str(self.state_file),
        ]  # fmt: skip
        self.log = tmp_path / "deviced.log"
        self.proc = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_http(f"http://{self.http}/healthz")

    def sigterm(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0

    def inject(self, device: int, code: str) -> None:
        body = json.dumps({"device": device, "code": code}).encode()
        req = urllib.request.Request(
            f"http://{self.http}/sim/fault", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=10) as r:
            return r.read().decode()

    def cycles(self) -> int:
        """Full cycles run (the poll-duration histogram's count)."""
        for line in self.metrics().splitlines():
            if line.startswith("faultmesh_deviced_poll_duration_seconds_count"):
                return int(float(line.split()[-1]))
        return 0

    def saved(self) -> dict:
        return json.loads(self.state_file.read_text())["devices"]["5"]


def test_sigterm_restart_keeps_restart_npu(tmp_path):
    cd = ClusterdProcess(tmp_path / "state").start()
    dev = Deviced(tmp_path, cd)
    try:
        dev.start()
        dev.inject(5, HBM)
        before = wait_for(
            lambda: [f for f in cd.get_json("/v1/faults") if f["code"] == HBM and f["level"] == "RestartNPU"],
            "80E18008 RestartNPU in clusterd",
        )[0]
        wait_for(lambda: dev.state_file.exists() and dev.saved()["frequency"], "the state file written")
        dev.sigterm()
        dev.start()
        wait_for(lambda: dev.cycles() > 0, "the first poll after the restart")  # it finds no fault
        dev.inject(5, HBM)  # the chip still has it: the driver reports it again
        wait_for(lambda: 'source="callback"' in dev.metrics(), "the callback handled")
        n = dev.cycles()
        wait_for(lambda: dev.cycles() > n + 1, "two more cycles (state file and report written)")
        saved = dev.saved()
        freq = saved["frequency"][str(0x80E18008)]
        assert len(freq["times"]) == 1 and freq["last_recover_ms"] == 0, saved
        assert saved["reasons"] == []
        faults = [f for f in cd.get_json("/v1/faults") if f["code"] == HBM]
        assert [(f["level"], f["first_seen_ms"]) for f in faults] == [("RestartNPU", before["first_seen_ms"])]
        assert "upgrade" not in faults[0]["attributes"]
        kinds = [e["kind"] for e in cd.get_json(f"/v1/events?node=node-r&code={HBM}")]
        assert kinds == ["occur"], kinds  # no recover/occur pair
    finally:
        if dev.proc is not None and dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait(10)
        cd.stop()
