"""noded's footprint: RSS and CPU% while polling a BMC holding 200 alarms every second.

Starts ``faultmesh bmc-sim --alarms 200`` (200 iBMC alarms = 15 OEM pages per poll), a real
``clusterd`` and ``noded --poll-interval 1`` (agent stream up), all on loopback. After a warm-up,
samples noded's RSS (/proc/<pid>/status VmRSS) and CPU time (/proc/<pid>/stat utime+stime) every
second for ``--duration`` seconds, and reads noded's /metrics for the number and duration of polls.
Half of the alarms change mid-run so the agent stream also carries deltas.

Beside it in the same run (unless ``--no-peers``): a ``deviced --backend sim`` (16 NPUs) on the same
clusterd, sampled the same way, and floor processes that only import a third-party stack and sleep:
``floor`` what both agents need (asyncio, grpc.aio, protobuf, h11, prometheus_client), ``floor_ipmi``
that plus pyghmi's IPMI session (what noded's BMC client uses): what no change of faultmesh's own
imports can go below; ``floor_ipmi_aiohttp`` the stack the agents loaded before issue 18's cuts
(aiohttp.web, uvloop and pyghmi's whole Command instead of h11, asyncio's loop and the session). Issue 18's figure
is at the real poll: ``--poll-interval 60 --duration 120``.

Run: ``.venv/bin/python bench/noded_overhead.py`` (45 s by default, about a minute in all) or
``--duration 120`` for the 2-minute figure of issue 3. The last line holds the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import ClusterdProcess, free_port, wait_http  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_READY = re.compile(r"bmc-sim listening on 127\.0\.0\.1:(\d+) control 127\.0\.0\.1:(\d+)")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def post(control: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://{control}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


FLOOR = {
    "floor": "asyncio, grpc.aio, google.protobuf.message, h11, prometheus_client",
    "floor_ipmi": "asyncio, grpc.aio, google.protobuf.message, h11, prometheus_client, pyghmi.ipmi.private.session",
    # the stack before issue 18's cuts (aiohttp.web, pyghmi's Command): a same-run "before" figure
    "floor_ipmi_aiohttp": "grpc.aio, google.protobuf.message, aiohttp.web, prometheus_client, uvloop, "
    "pyghmi.ipmi.command",
}


def start_peers(py: str, clusterd: str, tmp: Path) -> dict[str, subprocess.Popen]:
    """deviced (sim backend) on ``clusterd`` and the floor processes, each ready on return."""
    dhttp = f"127.0.0.1:{free_port()}"
    peers = {
        "deviced": subprocess.Popen(
            [
                py,
                "-m",
                "deviced",
                "--node-name",
                "bench-node-d",
                "--clusterd",
                clusterd,
                "--backend",
                "sim",
                "--http-addr",
                dhttp,
                "--log-level",
                "WARNING",
            ],
            stdout=open(tmp / "deviced.log", "wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    }
    for name, mods in FLOOR.items():
        code = f"import {mods}, sys, time; print('ready', flush=True); time.sleep(1e6)"
        peers[name] = subprocess.Popen([py, "-c", code], stdout=subprocess.PIPE, text=True)
        if peers[name].stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name} did not start")
    wait_http(f"http://{dhttp}/healthz")
    return peers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--duration", type=float, default=45.0, help="measured seconds (120 for the issue's figure)"
    )
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    ap.add_argument("--alarms", type=int, default=200)
    ap.add_argument("--poll-interval", type=float, default=1.0)
    ap.add_argument("--no-peers", action="store_true", help="noded only (no deviced, no floor process)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="noded-bench-"))
    pw = tmp / "bmc-password"
    pw.write_text("bench-password\n")
    py = sys.executable
    sim = noded = None
    peers: dict[str, subprocess.Popen] = {}
    cd = ClusterdProcess(tmp / "clusterd-state", log_path=tmp / "clusterd.log")
    try:
        sim = subprocess.Popen(
            [
                py,
                "-c",
                "import sys; from fmtools.cli import main; sys.exit(main())",
                "bmc-sim",
                "--port",
                "0",
                "--user",
                "admin",
                "--password-file",
                str(pw),
                "--alarms",
                str(args.alarms),
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        m = PAGE_READY.search(sim.stdout.readline())
        if not m:
            raise RuntimeError("bmc-sim did not start")
        bmc_port, control = int(m.group(1)), f"127.0.0.1:{m.group(2)}"
        cd.start()
        http = f"127.0.0.1:{free_port()}"
        log = open(tmp / "noded.log", "wb")
        noded = subprocess.Popen(
            [
                py,
                "-m",
                "noded",
                "--node-name",
                "bench-node",
                "--clusterd",
                cd.grpc,
                "--http-addr",
                http,
                "--bmc-host",
                "127.0.0.1",
                "--bmc-port",
                str(bmc_port),
                "--bmc-password-file",
                str(pw),
                "--poll-interval",
                str(args.poll_interval),
                "--log-level",
                "WARNING",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_http(f"http://{http}/healthz")
        if not args.no_peers:
            peers = start_peers(py, cd.grpc, tmp)
        time.sleep(args.warmup)

        def read_metrics() -> str:
            with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
                return r.read().decode()

        m0 = read_metrics()
        c0, t0 = cpu_seconds(noded.pid), time.monotonic()
        peer_c0 = {k: cpu_seconds(p.pid) for k, p in peers.items()}
        peer_rss: dict[str, list[float]] = {k: [] for k in peers}
        rss: list[float] = []
        changed = False
        while time.monotonic() - t0 < args.duration:
            time.sleep(1.0)
            rss.append(rss_mb(noded.pid))
            for k, p in peers.items():
                peer_rss[k].append(rss_mb(p.pid))
            if not changed and time.monotonic() - t0 > args.duration / 2:
                post(control, "/alarms/clear", {"device_type": "PCIe Card"})  # every alarm clears ...
                post(control, "/alarms", {"code": "2C000031", "device_type": "System", "count": args.alarms})
                changed = True  # ... and 200 new ones appear: one big delta
        c1, t1 = cpu_seconds(noded.pid), time.monotonic()
        peer_cpu = {k: 100.0 * (cpu_seconds(p.pid) - peer_c0[k]) / (t1 - t0) for k, p in peers.items()}
        m1 = read_metrics()
        faults_in_clusterd = len(cd.get_json("/v1/faults"))
        polls = metric(m1, 'faultmesh_noded_bmc_polls_total{result="ok"}') - metric(
            m0, 'faultmesh_noded_bmc_polls_total{result="ok"}'
        )
        failed = (
            metric(m1, "faultmesh_noded_bmc_polls_total") - metric(m0, "faultmesh_noded_bmc_polls_total")
        ) - polls
        dur = metric(m1, "faultmesh_noded_bmc_poll_duration_seconds_sum") - metric(
            m0, "faultmesh_noded_bmc_poll_duration_seconds_sum"
        )
        n = metric(m1, "faultmesh_noded_bmc_poll_duration_seconds_count") - metric(
            m0, "faultmesh_noded_bmc_poll_duration_seconds_count"
        )
        cpu_pct = 100.0 * (c1 - c0) / (t1 - t0)
        print(
            f"noded pid {noded.pid}, bmc-sim 127.0.0.1:{bmc_port} with {args.alarms} alarms, poll every "
            f"{args.poll_interval:g} s, clusterd {cd.grpc}; faults in clusterd at the end: {faults_in_clusterd}"
        )
        print(
            f"noded_overhead duration_s={t1 - t0:.0f} alarms={args.alarms} polls_ok={polls:.0f} "
            f"polls_failed={failed:.0f} poll_ms_avg={1000 * dur / max(n, 1):.1f} rss_mb_avg={sum(rss) / len(rss):.1f} "
            f"rss_mb_max={max(rss):.1f} cpu_pct={cpu_pct:.2f}"
            + "".join(
                f" {k}_rss_mb_avg={sum(v) / len(v):.1f} {k}_cpu_pct={peer_cpu[k]:.2f}"
                for k, v in peer_rss.items()
            )
        )
        return 0
    finally:
        for p in peers.values():
            stop(p)
        stop(noded)
        cd.stop()
        stop(sim)


if __name__ == "__main__":
    sys.exit(main())
