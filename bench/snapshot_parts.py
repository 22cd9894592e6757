"""A node state over the 4 MiB receive limit reaching clusterd in Snapshot parts (agent.proto
"Snapshot parts"): the time from the agent's start to clusterd's ack of the whole snapshot, and
clusterd's CPU and resident memory for it, per size of state.

For each fault count N a fresh clusterd process (benchkit.Clusterd) takes one AgentClient (this
process, the real client as NodeD/deviced use it) whose state is N faults of ``--attrs`` attributes
of 60 characters (~330 bytes a fault with 4). The first row is a state under 1 MiB (sent whole, one
message) as the baseline; the others go in parts of about 1 MiB. Each row prints the snapshot's
encoded MB, the parts sent, the seconds to the ack, the seconds per MB (comparable to the baseline's:
parts cost what one message costs when per-MB times match), clusterd's CPU seconds and its resident
memory before and after (its peak shows what holding the parts costs; the ack means the parts were
let go: ``faultmesh_agent_snapshot_parts_held_bytes`` is read back as 0), and the longest wait for
clusterd's ``/readyz`` polled every 10 ms meanwhile (how long its event loop was held at once).

Run: ``.venv/bin/python bench/snapshot_parts.py`` (10k, 40k and 65k faults; about a minute on 2
cores). The last line holds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import urllib.request

from benchkit import Clusterd
from loadgen import cpu_s, rss_mib

from faultmesh.agent import AgentClient, AgentState
from faultmesh.model import Fault


def state(n: int, attrs: int) -> AgentState:
    st = AgentState("node-1")
    values = {f"k{i}": "v" * 60 for i in range(attrs)}
    for i in range(n):
        st.upsert(Fault(source="bmc-oem", node="node-1", device_type="CPU", device_id=i % 64,
                        code=f"{i:08X}", level="SeparateFault", attributes=values))  # fmt: skip
    return st


def held_bytes(http: str) -> float:
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("faultmesh_agent_snapshot_parts_held_bytes "))
    return float(line.split()[1])


def poll(http: str, stop: threading.Event, waits: list[float]) -> None:
    """GET /readyz every 10 ms until ``stop``; each answer's wait (s) into ``waits``."""
    while not stop.is_set():
        t = time.monotonic()
        urllib.request.urlopen(f"http://{http}/readyz", timeout=30).read()
        waits.append(time.monotonic() - t)
        stop.wait(0.01)


async def one(n: int, attrs: int) -> dict:
    st = state(n, attrs)
    mb = st.snapshot(1).ByteSize() / 1e6
    with Clusterd() as cd:
        pid = cd.proc.pid
        cpu0, rss0 = cpu_s(pid), rss_mib(pid)
        client = AgentClient(cd.grpc, "node-1", "noded", state=st, resync_by_digest=False)
        stop = threading.Event()
        waits: list[float] = []
        poller = threading.Thread(target=poll, args=(cd.http, stop, waits), daemon=True)
        poller.start()
        t0 = time.monotonic()
        await client.start()
        try:
            await client.wait_synced(600)
            took = time.monotonic() - t0
        finally:
            stop.set()
            await client.stop()
        poller.join(10)
        row = {
            "faults": n,
            "mb": round(mb, 1),
            "parts": int(client.metrics.sent.labels("snapshot_part")._value.get()),
            "s": round(took, 2),
            "s_per_mb": round(took / mb, 3),
            "clusterd_cpu_s": round(cpu_s(pid) - cpu0, 2),
            "readyz_max_ms": round(max(waits, default=0) * 1000),
            "rss_mib": [round(rss0), round(rss_mib(pid))],
            "held_after": held_bytes(cd.http),
        }
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", default="10000,40000,65536", help="comma-separated fault counts")
    ap.add_argument("--attrs", type=int, default=4, help="attributes of 60 characters a fault")
    args = ap.parse_args()
    per_fault = state(2, args.attrs).snapshot(1).ByteSize() / 2
    fit = int(0.95 * (1 << 20) / per_fault)  # under 1 MiB: one message, the baseline
    rows = [asyncio.run(one(n, args.attrs)) for n in [fit, *map(int, args.faults.split(","))]]
    print(json.dumps({"snapshot_parts": rows}))


if __name__ == "__main__":
    main()
