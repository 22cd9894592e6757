"""noded against a peer nobody here wrote: OpenIPMI's ipmi_sim (issue 3 "A peer nobody here wrote").

An event added to ipmi_sim's SEL shows up as a node fault in clusterd; its deassertion, and clearing
the SEL, clear the fault. Configuration as in reference ecosystem.md §3.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time

import pytest
from noded_support import free_udp_port
from support import ClusterdProcess, NodedProcess, free_port, wait_for

from noded.bmc.client import BmcClient

IPMI_SIM = shutil.which("ipmi_sim")
pytestmark = pytest.mark.skipif(
    IPMI_SIM is None, reason="ipmi_sim not installed (apt-get install openipmi; .ci/run installs it)"
)

USER, PASSWORD = "admin", "ipmisim-pw"


class IpmiSim:
    """ipmi_sim on 127.0.0.1: LAN on ``port`` (UDP), emulator console on ``console`` (TCP)."""

    def __init__(self, tmp) -> None:
        self.dir = tmp / "ipmisim"
        (self.dir / "state").mkdir(parents=True)
        self.port = free_udp_port()
        self.console = free_port()
        (self.dir / "lan.conf").write_text(
            f'name "simbmc"\n'
            f"set_working_mc 0x20\n"
            f"  startlan 1\n"
            f"    addr 127.0.0.1 {self.port}\n"
            f"    priv_limit admin\n"
            f"    allowed_auths_callback md5\n"
            f"    allowed_auths_user md5\n"
            f"    allowed_auths_operator md5\n"
            f"    allowed_auths_admin md5\n"
            f"    guid a123456789abcdefa123456789abcdef\n"
            f"  endlan\n"
            f'  user 2 true "{USER}" "{PASSWORD}" admin 10 md5\n'
            f"console 127.0.0.1 {self.console}\n"
        )
        (self.dir / "sim.emu").write_text(
            "mc_setbmc 0x20\n"
            "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\n"
            "sel_enable 0x20 1000 0x0a\n"
            "mc_enable 0x20\n"
        )
        self.proc = None

    def start(self) -> IpmiSim:
        self._log = open(self.dir / "ipmi_sim.log", "ab")
        self.proc = subprocess.Popen(
            [
                IPMI_SIM,
                "-c",
                str(self.dir / "lan.conf"),
                "-f",
                str(self.dir / "sim.emu"),
                "-s",
                str(self.dir / "state"),
                "-n",
            ],
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                self.emu()  # the console answers with its prompt once the simulator is up
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        "ipmi_sim exited: " + (self.dir / "ipmi_sim.log").read_text()
                    ) from None
                time.sleep(0.1)
        raise RuntimeError("ipmi_sim console did not open")

    def emu(self, *cmds: str) -> str:
        """Run emulator commands on the console; returns its output. Reads up to the "> " prompt
        before every command and before closing: ipmi_sim 2.0.33 aborts (selector.c valid_fd) when a
        console connection closes before its greeting was read."""
        out = b""
        with socket.create_connection(("127.0.0.1", self.console), timeout=5) as s:
            s.settimeout(5)

            def prompt() -> bytes:
                buf = b""
                while not buf.rstrip(b" ").endswith(b">"):
                    d = s.recv(4096)
                    if not d:
                        raise ConnectionError("ipmi_sim console closed")
                    buf += d
                return buf

            out += prompt()
            for c in cmds:
                s.sendall(c.encode() + b"\n")
                out += prompt()
        return out.decode(errors="replace")

    def sel_event(
        self, sensor_type: int, sensor_num: int, offset: int, event_type=0x6F, deassert=False
    ) -> str:
        # 13 bytes after the record type: timestamp(4) generator(2) evm rev, sensor type, sensor number,
        # event dir/type, event data 1..3 (IPMI 2.0 §32.1)
        dir_type = (0x80 if deassert else 0) | event_type
        data = [0, 0, 0, 0, 0x20, 0x00, 0x04, sensor_type, sensor_num, dir_type, offset, 0xFF, 0xFF]
        return self.emu("sel_add 0x20 0x02 " + " ".join(f"0x{b:02x}" for b in data))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def clear_sel(sim: IpmiSim) -> None:
    """Reserve SEL + Clear SEL (netfn 0x0A cmd 0x42/0x47) over lanplus, as ``ipmitool sel clear``."""
    c = BmcClient("127.0.0.1", sim.port, USER, PASSWORD)
    try:
        reservation = c.raw(0x0A, 0x42)[:2]
        assert c.raw(0x0A, 0x47, reservation + b"CLR\xaa")[0] & 0x0F in (0, 1)
    finally:
        c.close()


def sel_faults(cd):
    return sorted(
        (f["device_type"], f["device_id"], f["code"], f["level"])
        for f in cd.get_json("/v1/faults")
        if f["node"] == "node-ipmisim" and f["source"] == "bmc-sel"
    )


def test_noded_against_ipmi_sim(tmp_path):
    sim = IpmiSim(tmp_path).start()
    cd = ClusterdProcess(tmp_path / "state", extra=["--drain-s", "0.5"]).start()
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    nd = NodedProcess(
        tmp_path,
        "node-ipmisim",
        cd.grpc,
        "--bmc-host",
        "127.0.0.1",
        "--bmc-port",
        str(sim.port),
        "--bmc-user",
        USER,
        "--bmc-password-file",
        str(pw),
        "--poll-interval",
        "1",
        "--bmc-timeout",
        "5",
        "--min-report-interval",
        "0.3",
        "--clusterd-backoff-max",
        "0.5",
    ).start()
    try:
        # a non-Huawei BMC (MontaVista, manufacturer 4753): noded reads the SEL
        wait_for(lambda: nd.get_json("/v1/state")["bmc_mode"] == "sel", timeout_s=20, what="sel mode")
        assert "Added record" in sim.sel_event(0x0C, 0x10, 0x01)  # memory uncorrectable ECC
        want = [("Memory", 0x10, "F10C6F01", "PreSeparateFault")]
        wait_for(lambda: sel_faults(cd) == want, timeout_s=20, what="SEL fault in clusterd")
        assert cd.get_json("/v1/nodes/node-ipmisim")["node_status"] == "PreSeparate"

        sim.sel_event(0x0C, 0x10, 0x01, deassert=True)  # deassertion recovers it
        wait_for(lambda: sel_faults(cd) == [], timeout_s=20, what="deasserted fault cleared")

        sim.sel_event(0x07, 0x01, 0x00)  # processor IERR
        sim.sel_event(0x99, 0x01, 0x03)  # unmapped sensor type: counted, not a fault
        wait_for(
            lambda: sel_faults(cd) == [("CPU", 1, "F1076F00", "SeparateFault")],
            timeout_s=20,
            what="IERR fault",
        )
        assert cd.get_json("/v1/nodes/node-ipmisim")["node_status"] == "UnHealthy"

        clear_sel(sim)  # an operator clearing the SEL (standard Clear SEL) clears the fault
        wait_for(lambda: sel_faults(cd) == [], timeout_s=20, what="fault cleared with the SEL")
        assert cd.get_json("/v1/nodes/node-ipmisim")["node_status"] == "Healthy"
        m = nd.metrics()
        assert 'faultmesh_noded_sel_records_total{result="unmapped"} 1.0' in m
    finally:
        nd.stop()
        cd.stop()
        sim.stop()
