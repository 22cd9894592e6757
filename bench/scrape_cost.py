"""``/metrics`` and ``/v1/nodes`` at 16k nodes x 10 faults, and the agent-stream delta rate while
both are scraped every second (issue 18), without connecting 16k agents first.

The state of N nodes (each with 16 NPU devices, agent status Healthy, 10 NPU faults of deviced:
every 7th fault SeparateNPU, the rest SubHealthFault) is written straight into a clusterd state
dir through :class:`clusterd.store.Store`; a real clusterd process (:class:`benchkit.Clusterd`)
starts on it and loads it, as after a restart. Then, with a client in this process (urllib): each
path's median time of 5 GETs, and the delta rate of 200 load agents (:class:`loadgen.Fleet`
worker processes, window 4) for ``--seconds`` quiet and then with both paths scraped once per
second (the same client). Baselines measured in the same run on the same machine: the same at
N/16 nodes (the cost should grow no faster than the nodes) and ``GET /healthz`` (one HTTP round
trip with nothing behind it).

Run: ``.venv/bin/python bench/scrape_cost.py`` (16,384 nodes; about 2 minutes on 2 cores). The last
line holds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request

from benchkit import Clusterd
from loadgen import Fleet

from clusterd.nodes import AGENT, NodeState
from clusterd.store import Store
from faultmesh.model import Fault

NPUS = 16
FAULTS = 10


async def _fill(state_dir: str, n: int) -> None:
    store = Store(state_dir)
    await store.open()
    try:
        for lo in range(0, n, 1024):
            names = [f"node-{i:05d}" for i in range(lo, min(n, lo + 1024))]
            faults = [
                (Fault(source="deviced", node=name, device_type="NPU", device_id=d, code=f"80E1800{d}",
                       level="SeparateNPU" if (d + i) % 7 == 0 else "SubHealthFault"), "deviced")
                for i, name in enumerate(names, lo) for d in range(FAULTS)
            ]  # fmt: skip
            await store.write_faults(faults)
            states = {}
            for i, name in enumerate(names, lo):
                st = NodeState(name, node_ip=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", node_sn=f"sn-{i}")
                st.status[AGENT] = "Healthy"
                st.devices = {
                    f"NPU-{d}": {"device_type": "NPU", "device_id": d, "health": "Healthy"}
                    for d in range(NPUS)
                }
                states[name] = st.to_json()
            await store.write_nodes(states)
    finally:
        await store.close()


def _get_s(url: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t, body


def one_size(fleet: Fleet, n: int, seconds: float) -> dict:
    """The figures of the module docstring at ``n`` nodes."""
    state = tempfile.mkdtemp(prefix="fm-scrape-")
    try:
        asyncio.run(_fill(state, n))
        with Clusterd(state_dir=state, ready_s=120) as cd:
            base = f"http://{cd.http}"
            listed = json.loads(_get_s(base + "/v1/nodes")[1])
            assert len(listed) == n and sum(x["faults"] for x in listed) == n * FAULTS, "state not loaded"
            times = {
                p: statistics.median(_get_s(base + p)[0] for _ in range(5))
                for p in ("/healthz", "/metrics", "/v1/nodes")
            }
            agents = list(range(200))
            quiet = fleet.run("deltas", agents, addr=cd.grpc, seconds=seconds, window=4)
            stop = threading.Event()
            scraped: list[float] = []

            def scraper() -> None:
                while not stop.wait(1.0):
                    scraped.append(sum(_get_s(base + p)[0] for p in ("/metrics", "/v1/nodes")))

            th = threading.Thread(target=scraper, daemon=True)
            th.start()
            try:
                busy = fleet.run("deltas", agents, addr=cd.grpc, seconds=seconds, window=4)
            finally:
                stop.set()
                th.join(60)
            fleet.close_streams()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return {"nodes": n, **{p: t for p, t in times.items()}, "quiet": quiet["n"] / quiet["wall_s"],
            "scraped": busy["n"] / busy["wall_s"], "scrapes": len(scraped),
            "scrape_s": statistics.median(scraped) if scraped else float("nan")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of each delta run")
    ap.add_argument("--procs", type=int, default=None, help="load worker processes (default cores - 1)")
    a = ap.parse_args()
    with Fleet(a.procs) as fleet:
        rs = [one_size(fleet, max(1, a.nodes // 16), a.seconds), one_size(fleet, a.nodes, a.seconds)]
    for r in rs:
        print(
            f"{r['nodes']:6d} nodes x {FAULTS} faults: /metrics {r['/metrics'] * 1e3:7.1f} ms  /v1/nodes "
            f"{r['/v1/nodes'] * 1e3:7.1f} ms  /healthz {r['/healthz'] * 1e3:5.1f} ms | deltas/s {r['quiet']:7.0f} "
            f"quiet, {r['scraped']:7.0f} scraped every 1 s (x{r['scraped'] / r['quiet']:.2f}; {r['scrapes']} "
            f"scrapes, both paths {r['scrape_s'] * 1e3:.0f} ms each)",
            flush=True,
        )
    b, r = rs
    print(
        f"RESULT nodes={r['nodes']} metrics_ms={r['/metrics'] * 1e3:.1f} v1_nodes_ms={r['/v1/nodes'] * 1e3:.1f} "
        f"healthz_ms={r['/healthz'] * 1e3:.1f} metrics_vs_1_16={r['/metrics'] / b['/metrics']:.1f} "
        f"v1_nodes_vs_1_16={r['/v1/nodes'] / b['/v1/nodes']:.1f} ingest_kept={r['scraped'] / r['quiet']:.2f} "
        f"ingest_kept_1_16={b['scraped'] / b['quiet']:.2f}"
    )


if __name__ == "__main__":
    main()
