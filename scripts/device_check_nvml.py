#!/usr/bin/env python3
"""The device check of ``deviced --backend nvml`` on a machine with a real NVIDIA GPU (issue 33).

Run from the repository root (``python scripts/device_check_nvml.py``; ``PYTHONPATH=services`` is set
for the child processes). It only READS the cards: no clocks, power limits, MIG, persistence mode,
application clocks or resets are touched (the NVML calls made are the backend's queries and the event
registration; nothing named nvmlDeviceSet* / nvmlDeviceReset* is called anywhere in faultmesh).

1. Through the backend directly: driver and NVML versions, GPU count, each GPU's identity (UUID,
   serial, PCI bus id, NVLinks), its readings (ECC volatile / aggregate single / double bit, retired
   pages pending, remapped rows, NVLink state and error counters, PCIe replays, clock event reasons,
   temperature and its thresholds) and the conditions the fault table makes of them; whether the XID
   subscription arms (events supported).
2. End to end: a local clusterd and ``deviced --backend nvml`` reporting to it for ``--seconds`` (30):
   the node and its GPUs in clusterd, the faults it holds, deviced's subscription and source gauges.
3. The profiler on the GPU: a short single-GPU PyTorch loop (matmuls, 20 steps) with
   ``Profiler(device_timer=EventTimer.cuda())``; FD-OL's reader parses the records and the step /
   forward durations from CUDA events are printed beside the host ones. Skipped (said so) when torch
   has no CUDA. It allocates ~100 MB on GPU 0 and changes no setting.

Bounded: every step has a timeout, the whole run stays well under 10 minutes. Exit 0 when both steps
worked (faults on the GPUs are printed, not failures), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

REASONS = {0x1: "gpu-idle", 0x2: "app-clocks", 0x4: "sw-power-cap", 0x8: "hw-slowdown", 0x10: "sync-boost",
           0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "hw-power-brake", 0x100: "display-clock"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def step1(seconds_for_events: float) -> bool:
    """The backend in this process: identity, readings, conditions, XID subscription."""
    from deviced.nvml import NvmlBackend
    from deviced.nvml_table import NvidiaTable

    table = NvidiaTable.load()
    names = {code: e.key for code, e in table.entries.items()}
    b = NvmlBackend(table)
    b.init()
    import pynvml

    print(f"driver {b.driver_version}; NVML {pynvml.nvmlSystemGetNVMLVersion()}; GPUs {len(b.handles)}")
    for d in b.devices():
        info = b.info[d.logic]
        print(f"GPU {d.logic}: {info.name} uuid={info.uuid} serial={info.serial or '-'} "
              f"pci={info.pci_bus_id} nvlinks_active={info.nvlinks}")  # fmt: skip
        conds, _ = b.conditions(d)
        r = b.readings[d.logic]
        reasons = r.get("clock_event_reasons")
        if reasons is not None:
            r["clock_event_reasons"] = f"0x{reasons:X} " + ",".join(
                v for k, v in REASONS.items() if reasons & k
            )
        print("  readings: " + json.dumps(r, default=str))
        print("  conditions: " + (", ".join(sorted(names.get(c, hex(c)) for c in conds)) or "none (healthy)"))
    got: list = []
    try:
        b.subscribe(got.append)
        print(f"XID subscription armed on GPUs {sorted(b.events_armed)}; waiting {seconds_for_events:.0f} s")
        time.sleep(seconds_for_events)
        print(f"XID events seen: {[(e.logic_id, e.event_name) for e in got] or 'none'}")
    except Exception as e:  # events unsupported: deviced would poll
        print(f"XID subscription NOT armed: {e} (deviced falls back to polling)")
    b.close()
    return bool(b.handles)


def step2(seconds: float) -> bool:
    """A local clusterd and deviced --backend nvml reporting to it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services"), "PYTHONUNBUFFERED": "1"}
    grpc, api, dv = free_port(), free_port(), free_port()
    logs = Path(os.environ.get("OUT", "/tmp")) / "device_check_nvml"
    logs.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    cd = subprocess.Popen([py, "-m", "clusterd", "--grpc-addr", f"127.0.0.1:{grpc}", "--http-addr",
                           f"127.0.0.1:{api}", "--state-dir", str(logs / f"state-{int(time.time())}")],
                          stdout=open(logs / "clusterd.log", "wb"), stderr=subprocess.STDOUT, env=env)  # fmt: skip
    dvp = subprocess.Popen([py, "-m", "deviced", "--node-name", "gpu-check", "--clusterd", f"127.0.0.1:{grpc}",
                            "--backend", "nvml", "--http-addr", f"127.0.0.1:{dv}", "--list-watch-period", "3"],
                           stdout=open(logs / "deviced.log", "wb"), stderr=subprocess.STDOUT, env=env)  # fmt: skip
    ok = False
    try:
        deadline = time.monotonic() + seconds
        node = None
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                if "gpu-check" in get(f"http://127.0.0.1:{api}/v1/nodes"):
                    node = get(f"http://127.0.0.1:{api}/v1/nodes/gpu-check")
            except OSError:
                continue
        devs = json.loads(get(f"http://127.0.0.1:{dv}/v1/devices"))
        metrics = get(f"http://127.0.0.1:{dv}/metrics")
        faults = [f for f in json.loads(get(f"http://127.0.0.1:{api}/v1/faults")) if f["node"] == "gpu-check"]
        print(f"deviced: subscribed={devs['subscribed']} GPUs={len(devs['devices'])}")
        for g in json.loads(get(f"http://127.0.0.1:{dv}/v1/gpus"))["gpus"]:
            print(f"  /v1/gpus {g['index']}: {g['uuid']} {g['pci_bus_id']} lost={g['lost']} "
                  f"xid_events_armed={g['xid_events_armed']}")  # fmt: skip
        for d in devs["devices"]:
            print(f"  GPU {d['logic_id']}: health={d['health']} level={d['level'] or '-'} "
                  f"codes={[c['code'] + ':' + c['level'] for c in d['codes']]}")  # fmt: skip
        for name in ("faultmesh_deviced_subscribed", 'faultmesh_source_up{source="nvml"}',
                     "faultmesh_deviced_nvml_unknown_xids_total"):  # fmt: skip
            m = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
            print(f"  {name} = {m.group(1) if m else 'absent'}")
        print(f"clusterd: node known={node is not None}; faults={json.dumps(faults)}")
        ok = node is not None and len(devs["devices"]) > 0
    except (OSError, ValueError, KeyError) as e:
        print(f"end-to-end step failed: {e}")
    finally:
        for p in (dvp, cd):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        print(f"logs: {logs}")
    return ok


def step3(tmp: Path) -> bool | None:
    """A single-GPU loop with CUDA-event timing; FD-OL parses its records. None when skipped."""
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return None
    if not torch.cuda.is_available():
        print(f"skipped: torch {torch.__version__} sees no CUDA device")
        return None
    from faultmesh.profiler import Profiler
    from faultmesh.profiler.device import EventTimer
    from fdol.slownode.metrics import StepAssembler
    from fdol.slownode.reader import JobReader

    p = Profiler(0, base_dir=tmp, task_id="gpu-check", flush_interval_s=0, device_timer=EventTimer.cuda())
    x = torch.randn(4096, 4096, device="cuda")
    for s in range(20):
        with p.step(s):
            with p.forward():
                for _ in range(8):
                    y = x @ x
    torch.cuda.synchronize()
    p.close()
    jr = JobReader(tmp / "gpu-check", [0])
    recs = jr.poll()[0]
    steps = (a := StepAssembler(0, lambda: jr.groups(0))).feed(recs) + a.flush()
    fwd = {}
    for r in recs:
        if r.name == "forward" or r.id in fwd:
            fwd.setdefault(r.id, {})[(r.flag, r.source_kind)] = r.ts
    print(
        f"records {len(recs)} (bad {sum(jr.bad.values())}); steps parsed {len(steps)}; y={float(y[0, 0]):.1f}"
    )
    for m in steps[-3:]:
        print(
            f"  step {m.step}: device step_time {m.step_time / 1e6:.2f} ms, host forward {m.compute / 1e6:.2f} ms"
        )
    return len(steps) >= 19 and sum(jr.bad.values()) == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long deviced reports (s)")
    ap.add_argument("--event-wait", type=float, default=5.0, help="s to listen for XID events in step 1")
    args = ap.parse_args()
    watchdog = threading.Timer(540, lambda: (print("device check: 9 min budget spent"), os._exit(1)))
    watchdog.daemon = True
    watchdog.start()
    print("== step 1: NVML through deviced's backend (read only)")
    ok1 = step1(args.event_wait)
    print("== step 2: deviced --backend nvml -> local clusterd")
    ok2 = step2(args.seconds)
    print("== step 3: the profiler with CUDA-event timing on GPU 0")
    ok3 = step3(Path(os.environ.get("OUT", "/tmp")) / "device_check_profiling")
    ok = ok1 and ok2 and ok3 is not False
    print(f"== device check {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
