"""Issue 31's "done when" on the real things: a real clusterd with active faults, a real Prometheus
(2.x, ``prometheus`` on PATH) scraping it every 2 s and evaluating the chart's rules
(charts/faultmesh/files/prometheus-rules.yaml) every 2 s. clusterd is frozen (SIGSTOP) for
``--blind-s`` seconds, then resumed (SIGCONT).

Figures: seconds from the freeze until FaultmeshClusterdAbsent fires; whether FaultmeshNodeUnhealthy
and FaultmeshFaultSeparated stayed firing through the whole freeze and after it with the same
``activeAt`` (not started over); seconds from the resume until ClusterdAbsent resolves. The rules'
``for`` durations are the shipped ones (1 m for the node alerts), so a run takes about
``--blind-s`` + 2 minutes.

Run: ``.venv/bin/python bench/blind_alerts.py`` (180 s frozen, about 5 minutes). The last line
holds the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchkit import Clusterd, free_port

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "charts" / "faultmesh" / "files" / "prometheus-rules.yaml"
HELD = ("FaultmeshNodeUnhealthy", "FaultmeshFaultSeparated")


def _alerts(prom: str) -> dict[str, dict]:
    """alertname -> the firing alert (Prometheus /api/v1/alerts; {} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{prom}/api/v1/alerts", timeout=5) as r:
            got = json.loads(r.read())["data"]["alerts"]
    except OSError:
        return {}
    return {a["labels"]["alertname"]: a for a in got if a["state"] == "firing"}


def _wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(1)
    raise TimeoutError(what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blind-s", type=float, default=180.0, help="seconds clusterd stays frozen")
    a = ap.parse_args()
    exe = shutil.which("prometheus")
    if exe is None:
        sys.exit("prometheus not installed (apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="fm-blind-"))
    with Clusterd() as cd:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "services")}
        send = [sys.executable, "-m", "faultmesh", "pubfault", "send", "--http", cd.http, "--grpc", cd.grpc]
        subprocess.run([*send, "--code", "020001001", "--node", "node-1", "--devices", "5", "--new-node"],
                       check=True, env=env, capture_output=True, timeout=60)  # fmt: skip
        prom = f"127.0.0.1:{free_port()}"
        (work / "prometheus.yml").write_text(
            "global: {scrape_interval: 2s, scrape_timeout: 1s, evaluation_interval: 2s}\n"
            f"rule_files: [{RULES}]\n"
            f"scrape_configs: [{{job_name: clusterd, static_configs: [{{targets: ['{cd.http}']}}]}}]\n"
        )
        proc = subprocess.Popen(
            [exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address={prom}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            before = _wait(
                lambda: (f := _alerts(prom)) and all(n in f for n in HELD) and f, 180, "alerts firing"
            )
            active = {n: before[n]["activeAt"] for n in HELD}
            os.kill(cd.proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            absent_s, held = None, True
            while time.monotonic() - frozen < a.blind_s:
                f = _alerts(prom)
                if absent_s is None and "FaultmeshClusterdAbsent" in f:
                    absent_s = time.monotonic() - frozen
                held &= all(n in f and f[n]["activeAt"] == active[n] for n in HELD)
                time.sleep(2)
            os.kill(cd.proc.pid, signal.SIGCONT)
            resumed = time.monotonic()
            _wait(lambda: "FaultmeshClusterdAbsent" not in _alerts(prom), 60, "ClusterdAbsent to resolve")
            back_s = time.monotonic() - resumed
            time.sleep(10)
            f = _alerts(prom)
            after = all(n in f and f[n]["activeAt"] == active[n] for n in HELD)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            shutil.rmtree(work, ignore_errors=True)
    print(
        f"blind_s={a.blind_s:.0f} clusterd_absent_after_s={absent_s if absent_s is None else round(absent_s, 1)} "
        f"held_through_blindness={held} same_alerts_after_resume={after} absent_resolved_after_s={back_s:.1f}"
    )


if __name__ == "__main__":
    main()
