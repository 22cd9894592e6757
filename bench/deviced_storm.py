"""deviced callback storm: 10,000 DCMI fault callbacks/s for 10 s from a C thread of the test
libdcmi.so (tests/native), through the real ctypes binding into a running deviced (no clusterd; the
report target is the agent state that the stream sends).

Prints: callbacks fired, events handled per second, callback-to-report latency p50/p99 (from the C
fire time to the cycle that reported the event), token-bucket drops, RSS before/after, and whether the
final reported state equals the last event per (device, code) (= the C library's live code lists).
The last line is a one-line summary. ``--rate-limit`` (callbacks accepted per minute) defaults to
1,000,000 so every event goes through the engine; pass 1000 for the reference's bucket (drops are then
mended by re-polling). Runs in well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from native.build import build_libs  # noqa: E402

from deviced.app import DeviceD, build_parser  # noqa: E402
from deviced.backends import DcmiBackend  # noqa: E402
from faultmesh.dcmi.loader import load_dcmi  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run(rate: int, seconds: float, devices: int, codes: int, limit: int) -> int:
    libs = build_libs()
    lib = load_dcmi(libs.dcmi)
    i, u = ctypes.c_int, ctypes.c_uint
    lib.symbol("dcmitest_reset", None, i, i)(1, devices)
    storm_start = lib.symbol("dcmitest_storm_start", i, i, i, i, i, u)
    storm_wait = lib.symbol("dcmitest_storm_wait", ctypes.c_long)
    fire_ns = lib.symbol("dcmitest_storm_fire_ns", ctypes.c_longlong, i)
    errlist = lib.symbol("dcmi_get_device_errorcode_v2", i, i, i, ctypes.POINTER(i), ctypes.POINTER(u), u)

    args = build_parser().parse_args(
        [
            "--node-name", "bench", "--clusterd", f"127.0.0.1:{free_port()}", "--backend", "dcmi",
            "--dcmi-lib", str(libs.dcmi), "--no-switch", "--probe-interval", "0",
            "--callback-rate-limit", str(limit), "--list-watch-period", "3", "--log-level", "ERROR",
        ]
    )  # fmt: skip
    app = DeviceD(args, DcmiBackend(args.dcmi_lib, None, want_switch=False))
    latencies: list[int] = []
    reported = 0

    def hook(batch, now_ns):
        nonlocal reported
        for ev, _cb_ns in batch:
            t = fire_ns(ev.event_serial_num)
            if t:
                latencies.append(now_ns - t)
        reported += len(batch)

    app.report_latency_hook = hook
    await app.start()
    while app.cycles < 1:
        await asyncio.sleep(0.05)
    rss0 = rss_mb()
    total = int(rate * seconds)
    t0 = time.perf_counter()
    if storm_start(rate, int(seconds * 1000), devices, codes, 11) != 0:
        print("storm start failed", file=sys.stderr)
        return 1
    fired = await asyncio.to_thread(storm_wait)
    t_fired = time.perf_counter() - t0
    # wait for the callbacks to be drained and the last events (recovers are 1 s late) reported
    deadline = time.monotonic() + 20

    def live() -> set[tuple[int, str]]:
        out = set()
        for dev in range(devices):
            n = ctypes.c_int(0)
            arr = (u * 128)()
            errlist(0, dev, ctypes.byref(n), arr, 128)
            out |= {(dev, f"{arr[k]:08X}") for k in range(n.value)}
        return out

    def active() -> set[tuple[int, str]]:
        return {
            (k.device_id, k.code)
            for k, f in app.state.faults.items()
            if k.source == "dcmi" and "recovered" not in f.attributes
        }

    want = live()
    while time.monotonic() < deadline and (app.callbacks < fired or active() != want):
        await asyncio.sleep(0.1)
    t_done = time.perf_counter() - t0
    ok = active() == want
    rss1 = rss_mb()
    handled = app.engine.stats["events_callback"]
    stale = app.engine.stats["stale_event"]
    await app.stop()
    latencies.sort()

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1e6 if latencies else float("nan")
        )

    print(f"callbacks fired        {fired} in {t_fired:.2f} s ({fired / t_fired:.0f}/s, asked {rate}/s)")
    print(f"callbacks received     {app.callbacks}, dropped by token bucket {app.callback_drops}")
    print(
        f"events handled         {handled} ({handled / t_done:.0f}/s over {t_done:.2f} s to converge; "
        f"{stale} superseded by a newer event)"
    )
    print(
        f"callback->report ms    p50 {pct(0.5):.1f}  p99 {pct(0.99):.1f}  max {pct(1.0):.1f} ({len(latencies)} events)"
    )
    print(f"RSS MB                 before {rss0:.1f}  after {rss1:.1f}")
    print(
        f"final state            {'== last event per (device, code)' if ok else 'MISMATCH'} ({len(want)} live codes)"
    )
    print(
        f"SUMMARY events/s={handled / t_done:.0f} cb/s={fired / t_fired:.0f} p99_ms={pct(0.99):.1f} "
        f"rss_mb={rss0:.1f}->{rss1:.1f} drops={app.callback_drops} state_ok={ok} total={total}"
    )
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=int, default=10_000, help="callbacks per second")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--codes", type=int, default=8, help="distinct fault codes (1..8)")
    p.add_argument("--rate-limit", type=int, default=1_000_000, help="accepted callbacks per minute")
    a = p.parse_args()
    logging.disable(logging.WARNING)
    import uvloop

    return uvloop.run(run(a.rate, a.seconds, a.devices, a.codes, a.rate_limit))


if __name__ == "__main__":
    sys.exit(main())
