"""``/metrics`` and ``/v1/nodes`` at 16k nodes x 10 faults, and the agent-stream delta rate while
both are scraped every second (issue 18), without connecting 16k agents first.

The state of N nodes (each with 16 NPU devices, agent status Healthy, 10 NPU faults of deviced:
every 7th fault SeparateNPU, the rest SubHealthFault) is written straight into a clusterd state
dir through :class:`clusterd.store.Store`; a real clusterd process (:class:`benchkit.Clusterd`)
starts on it and loads it, as after a restart. Then, with a client in this process (urllib): each
path's first GET (it renders every node: what every scrape cost before the per-node change feed of
:mod:`clusterd.pieces`), its median time of 5 GETs after that, and the delta rate of 200 load agents (:class:`loadgen.Fleet`
worker processes, window 4) for ``--seconds`` quiet and then with both paths scraped once per
second (:func:`benchkit.scrape_while_ingest`; also each path's median time while ingesting, when
the 200 nodes' changes are re-rendered at each scrape). Baselines measured in the same run on the same machine: the same at
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

from benchkit import Clusterd, get_s, scrape_while_ingest
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


def one_size(fleet: Fleet, n: int, seconds: float) -> dict:
    """The figures of the module docstring at ``n`` nodes."""
    state = tempfile.mkdtemp(prefix="fm-scrape-")
    paths = ("/metrics", "/v1/nodes")
    try:
        asyncio.run(_fill(state, n))
        with Clusterd(state_dir=state, ready_s=120) as cd:
            base = f"http://{cd.http}"
            first = {p: get_s(base + p) for p in paths}  # the first GET renders every node
            listed = json.loads(first["/v1/nodes"][1])
            assert len(listed) == n and sum(x["faults"] for x in listed) == n * FAULTS, "state not loaded"
            times = {p: statistics.median(get_s(base + p)[0] for _ in range(5)) for p in ("/healthz", *paths)}
            ing = scrape_while_ingest(fleet, cd, paths, seconds)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return {"nodes": n, **times, **{f"first{p}": t for p, (t, _) in first.items()}, **ing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16384)
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of each delta run")
    ap.add_argument("--procs", type=int, default=None, help="load worker processes (default cores - 1)")
    a = ap.parse_args()
    with Fleet(a.procs) as fleet:
        rs = [one_size(fleet, max(1, a.nodes // 16), a.seconds), one_size(fleet, a.nodes, a.seconds)]
    for r in rs:
        busy = r["scrape_s"]
        print(
            f"{r['nodes']:6d} nodes x {FAULTS} faults: /metrics {r['/metrics'] * 1e3:6.1f} ms (first, all "
            f"rendered {r['first/metrics'] * 1e3:6.1f}; while ingesting {busy['/metrics'] * 1e3:6.1f})  /v1/nodes "
            f"{r['/v1/nodes'] * 1e3:6.1f} ms (first {r['first/v1/nodes'] * 1e3:6.1f}; while ingesting "
            f"{busy['/v1/nodes'] * 1e3:6.1f})  /healthz {r['/healthz'] * 1e3:4.1f} ms | deltas/s "
            f"{r['quiet']:6.0f} quiet, {r['scraped']:6.0f} scraped every 1 s (x{r['scraped'] / r['quiet']:.2f}; "
            f"{r['scrapes']} scrapes)",
            flush=True,
        )
    b, r = rs
    busy = r["scrape_s"]
    print(
        f"RESULT nodes={r['nodes']} metrics_ms={r['/metrics'] * 1e3:.1f} v1_nodes_ms={r['/v1/nodes'] * 1e3:.1f} "
        f"metrics_ingesting_ms={busy['/metrics'] * 1e3:.1f} v1_nodes_ingesting_ms={busy['/v1/nodes'] * 1e3:.1f} "
        f"metrics_first_ms={r['first/metrics'] * 1e3:.1f} v1_nodes_first_ms={r['first/v1/nodes'] * 1e3:.1f} "
        f"healthz_ms={r['/healthz'] * 1e3:.1f} metrics_vs_1_16={r['/metrics'] / b['/metrics']:.1f} "
        f"v1_nodes_vs_1_16={r['/v1/nodes'] / b['/v1/nodes']:.1f} ingest_kept={r['scraped'] / r['quiet']:.2f} "
        f"ingest_kept_1_16={b['scraped'] / b['quiet']:.2f}"
    )


if __name__ == "__main__":
    main()
