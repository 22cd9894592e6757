"""clusterd at 1k / 4k / 16k nodes: resident memory and CPU, with Kubernetes mode publishing
cluster-info for every node (issue 8 "clusterd sized in values for 1k / 4k / 16k nodes").

For each size N a real clusterd process runs ``--kube`` against kmock's API emulator (in this
process, N Node objects); N simulated deviced agents connect over the agent stream (16 NPUs each,
10% of the nodes with two NPU faults and a node fault from a noded stream), then the benchmark waits
until every node is in the published ``cluster-info-device-*`` shards and reads clusterd's RSS and
CPU time from /proc. The chart's ``clusterd.scale`` presets come from these figures.

Run: ``.venv/bin/python bench/clusterd_scale.py`` (1k and 4k nodes, under a minute). The 16k figure
needs ``--nodes 16000`` and several minutes on 2 cores: connecting 16k agent streams dominates.
The last line holds the figures.

``--resync 1000,4000,16384`` measures the other scale figure of issue 18 instead: N deviced agents
(16 NPUs each, 10 faults on every 10th node) snapshot into clusterd, clusterd restarts on the same
state, and the agents reconnect as real agents do (the restart resync): a Hello carrying the digest
claim of their snapshot (agent.proto; the first connect sent the claim as its own Delta and learnt
that this clusterd answers claims), the full snapshot only where clusterd does not match it. Then every
agent sends one more message on its open stream: the claim of the same state (unchanged: the
digest path), the same state as a full snapshot (what an unchanged resync cost before digests), and
a snapshot with every NPU's health and every fault's level changed: clusterd's CPU for each is the
cost of a snapshot without the connect, and ``unchanged_cpu_vs_changed`` the goal's ratio (≤ 0.1).
An empty Delta (a heartbeat) goes first: the cost of any one message on clusterd's agent stream, the
floor under the claim.
Agents are played by :class:`loadgen.Fleet` worker processes; beside each figure it prints
the clients' CPU, the same job against :class:`loadgen.EchoServer` (a server doing no work: it
matches every claim) and the per-agent time relative to the first size, so the figures read as
ratios on a noisy box.

``--scrape 16384`` fills clusterd with N nodes x 10 NPU faults (agents as above), then times
``GET /metrics`` and ``GET /v1/nodes`` (median of 5; the same at 1/16 of the size is the baseline
beside it) and the agent-stream delta rate with and without both scraped once per second.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import urllib.request

import kmock
import uvloop
from benchkit import Clusterd, get_s, scrape_while_ingest
from loadgen import EchoServer, Fleet, cpu_s, node_name, quantile, rss_mib

# The bench's agents send no heartbeat (real ones do every 10 s): without this, the streams that wait
# out a 16k-agent phase go stale after 30 s and every next message pays "live again" (a node row
# rewritten per agent), charged to whichever snapshot comes first.
QUIET_AGENTS = ("--agent-stale-after-s", "3600")


def published_nodes(emu) -> int:
    total = 0
    for (res, _ns, name), obj in list(emu.objects.items()):
        if res.plural == "configmaps" and name.startswith("cluster-info-device-") and not obj.deleted:
            value = (obj.get("data") or {}).get(name) or ""
            total += value.count('"CmName":"mindx-dl-deviceinfo-')  # cheap: no parse on kmock's loop
    return total


async def run_size(fleet: Fleet, n: int, faulty_every: int) -> dict:
    """One size of the Kubernetes-mode bench: N deviced agents (and a noded stream on every
    ``faulty_every``-th node) connect to a ``--kube`` clusterd; figures in MiB, s and cores."""
    async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as srv:
        emu.resources["v1/configmaps"] = {}
        emu.resources["v1/nodes"] = {}
        emu.resources["v1/pods"] = {}
        for i in range(n):
            name = node_name(i)
            emu.objects[(kmock.resource("v1/nodes"), None, name)] = {"metadata": {"name": name}}
        cd = Clusterd("--kube", "--kube-api", str(srv.url).rstrip("/"), "--kube-min-write-s", "1")
        await asyncio.to_thread(cd.__enter__)  # kmock answers on this loop meanwhile
        try:
            idle_rss = rss_mib(cd.pid)
            cpu0 = cpu_s(cd.pid)
            t0 = time.perf_counter()
            job = {"addr": cd.grpc, "npus": 16, "faults": 2, "faulty_every": faulty_every}
            dev = await asyncio.to_thread(fleet.run, "resync", list(range(n)), **job)
            nod = await asyncio.to_thread(
                fleet.run, "resync", list(range(0, n, faulty_every)), agent="noded", keep=True, **job
            )
            connect_s = time.perf_counter() - t0
            if dev["retries"] + nod["retries"]:
                print(f"  ({dev['retries'] + nod['retries']} agent streams had to reconnect)", flush=True)
            t0 = time.perf_counter()
            while published_nodes(emu) < n:
                await asyncio.sleep(1.0)
                if time.perf_counter() - t0 > 180:
                    metrics = await asyncio.to_thread(
                        lambda: urllib.request.urlopen(f"http://{cd.http}/metrics", timeout=5).read().decode()
                    )
                    kube = "\n".join(
                        line for line in metrics.splitlines() if "kube" in line and not line.startswith("#")
                    )
                    raise TimeoutError(
                        f"only {published_nodes(emu)} of {n} nodes published; clusterd:\n{kube}"
                    )
            publish_s = time.perf_counter() - t0
            busy_cpu = cpu_s(cd.pid) - cpu0
            loaded_rss = rss_mib(cd.pid)
            c1 = cpu_s(cd.pid)
            await asyncio.sleep(5)
            steady_cores = (cpu_s(cd.pid) - c1) / 5
            await asyncio.to_thread(fleet.close_streams)
        finally:
            await asyncio.to_thread(cd.__exit__)
    return {
        "nodes": n,
        "idle_rss_mib": idle_rss,
        "rss_mib": loaded_rss,
        "connect_s": connect_s,
        "publish_s": publish_s,
        "busy_cpu_s": busy_cpu,
        "steady_cores": steady_cores,
    }


def resync_size(fleet: Fleet, n: int, profile: str | None) -> dict:
    """One size of the resync bench (see the module docstring); figures in s, MiB and CPU s."""
    items = list(range(n))
    job = {"npus": 16, "faults": 10, "faulty_every": 10}
    with EchoServer() as srv:
        echo = fleet.run("resync", items, addr=srv.addr, claim="hello", **job)
        # the floor of one more message on an open stream: the echo server's CPU for a claim, a snapshot
        echo_snaps = {}
        for name, changed, claim in (("unchanged", False, True), ("changed", True, False)):
            c0 = cpu_s(srv.pid)
            fleet.run("resnap", [], changed=changed, claim=claim)
            echo_snaps[name] = cpu_s(srv.pid) - c0
        fleet.close_streams()
    state = tempfile.mkdtemp(prefix="fm-resync-")
    try:
        with Clusterd(*QUIET_AGENTS, state_dir=state) as cd:
            first = fleet.run("resync", items, addr=cd.grpc, claim=True, **job)
            fleet.close_streams()
        with Clusterd(*QUIET_AGENTS, state_dir=state, profile=profile) as cd:
            c0 = cpu_s(cd.pid)
            same = fleet.run("resync", items, addr=cd.grpc, claim="hello", **job)
            same_cpu = cpu_s(cd.pid) - c0
            # one more message on the open streams: its cost alone, unchanged (the digest claim, then
            # the same state as a full snapshot) and changed
            snaps = {}
            for name, changed, claim, empty in (
                ("heartbeat", False, False, True),
                ("unchanged", False, True, False),
                ("full", False, False, False),
                ("changed", True, False, False),
            ):
                c0 = cpu_s(cd.pid)
                r = fleet.run("resnap", [], changed=changed, claim=claim, empty=empty)
                snaps[name] = (r["wall_s"], cpu_s(cd.pid) - c0, r["matched"])
            rss = rss_mib(cd.pid)
            fleet.close_streams()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if same["matched"] != n or snaps["unchanged"][2] != n:
        print(f"  (digest path not taken: {same['matched']} / {snaps['unchanged'][2]} of {n} matched)")
    return {
        "nodes": n,
        "echo_s": echo["wall_s"],
        "first_s": first["wall_s"],
        "resync_s": same["wall_s"],
        "resync_cpu_s": same_cpu,
        "snap_s": snaps["unchanged"][0],
        "snap_cpu_s": snaps["unchanged"][1],
        "heartbeat_cpu_s": snaps["heartbeat"][1],
        "full_s": snaps["full"][0],
        "full_cpu_s": snaps["full"][1],
        "echo_claim_cpu_s": echo_snaps["unchanged"],
        "echo_changed_cpu_s": echo_snaps["changed"],
        "changed_s": snaps["changed"][0],
        "changed_cpu_s": snaps["changed"][1],
        "client_cpu_s": same["cpu_s"],
        "p99_s": quantile(same["lat"], 0.99),
        "rss_mib": rss,
        "retries": same["retries"],
    }


def resync_main(sizes: list[int], procs: int | None, profile: str | None) -> None:
    """Print one line per size and the RESULT line (ratios against the echo server and the first size)."""
    results = []
    with Fleet(procs) as fleet:
        for n in sizes:
            r = resync_size(fleet, n, f"{profile}.{n}" if profile else None)
            results.append(r)
            base = results[0]
            per_agent = (r["resync_s"] / n) / (base["resync_s"] / base["nodes"])
            print(
                f"{n:6d} agents x 16 NPUs: restart resync {r['resync_s']:6.2f} s (clusterd CPU "
                f"{r['resync_cpu_s']:5.2f} s, p99 {r['p99_s']:.2f} s) | first {r['first_s']:6.2f} s | echo "
                f"server {r['echo_s']:5.2f} s | a further snapshot on the open streams: unchanged "
                f"(digest) {r['snap_s']:5.2f} s (CPU {r['snap_cpu_s']:5.2f} s), the same as a full snapshot "
                f"{r['full_s']:5.2f} s (CPU {r['full_cpu_s']:5.2f} s), changed {r['changed_s']:5.2f} s (CPU "
                f"{r['changed_cpu_s']:5.2f} s); an empty delta (heartbeat): CPU {r['heartbeat_cpu_s']:5.2f} s "
                f"(echo server CPU: claim {r['echo_claim_cpu_s']:5.2f} s, changed "
                f"{r['echo_changed_cpu_s']:5.2f} s) | RSS {r['rss_mib']:6.1f} MiB | clients {fleet.procs} procs, "
                f"CPU {r['client_cpu_s']:5.2f} s | per agent x{per_agent:.2f} of {base['nodes']} "
                f"| retries {r['retries']}",
                flush=True,
            )
    print(
        "RESULT "
        + " ".join(
            f"n{r['nodes']}_resync_s={r['resync_s']:.2f} n{r['nodes']}_vs_echo={r['resync_s'] / r['echo_s']:.1f} "
            f"n{r['nodes']}_unchanged_cpu_vs_changed={r['snap_cpu_s'] / max(r['changed_cpu_s'], 1e-9):.2f} "
            f"n{r['nodes']}_heartbeat_cpu_vs_changed={r['heartbeat_cpu_s'] / max(r['changed_cpu_s'], 1e-9):.2f} "
            f"n{r['nodes']}_full_unchanged_cpu_vs_changed={r['full_cpu_s'] / max(r['changed_cpu_s'], 1e-9):.2f} "
            f"n{r['nodes']}_rss_mib={r['rss_mib']:.0f}"
            for r in results
        )
    )


def scrape_size(fleet: Fleet, n: int, seconds: float) -> dict:
    """Scrape times (s) at ``n`` nodes x 10 faults and the delta rate with / without scraping."""
    import statistics

    paths = ("/metrics", "/v1/nodes")
    with Clusterd() as cd:
        fleet.run("resync", list(range(n)), addr=cd.grpc, npus=16, faults=10, faulty_every=1)
        times = {p: statistics.median(get_s(f"http://{cd.http}{p}")[0] for _ in range(5)) for p in paths}
        ing = scrape_while_ingest(fleet, cd, paths, seconds)
    return {"nodes": n, "metrics_s": times["/metrics"], "nodes_s": times["/v1/nodes"],
            "quiet_rate": ing["quiet"], "scraped_rate": ing["scraped"]}  # fmt: skip


def scrape_main(n: int, procs: int | None, seconds: float) -> None:
    """Print the scrape figures at n/16 (baseline) and n nodes, then the RESULT line."""
    with Fleet(procs) as fleet:
        rs = [scrape_size(fleet, max(1, n // 16), seconds), scrape_size(fleet, n, seconds)]
    for r in rs:
        print(
            f"{r['nodes']:6d} nodes x 10 faults: /metrics {r['metrics_s'] * 1e3:7.1f} ms  /v1/nodes "
            f"{r['nodes_s'] * 1e3:7.1f} ms | deltas/s {r['quiet_rate']:7.0f} quiet, {r['scraped_rate']:7.0f} "
            f"scraped every 1 s (x{r['scraped_rate'] / r['quiet_rate']:.2f})",
            flush=True,
        )
    b, r = rs
    print(
        f"RESULT nodes={n} metrics_ms={r['metrics_s'] * 1e3:.1f} v1_nodes_ms={r['nodes_s'] * 1e3:.1f} "
        f"metrics_vs_1_16={r['metrics_s'] / b['metrics_s']:.1f} v1_nodes_vs_1_16={r['nodes_s'] / b['nodes_s']:.1f} "
        f"ingest_kept={r['scraped_rate'] / r['quiet_rate']:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1000,4000", help="comma-separated cluster sizes")
    ap.add_argument("--faulty-every", type=int, default=10, help="one node in this many has faults")
    ap.add_argument("--resync", default="", help="comma-separated sizes: the restart-resync bench instead")
    ap.add_argument("--procs", type=int, default=None, help="load worker processes (default cores - 1)")
    ap.add_argument("--profile", default=None, help="cProfile the restarted clusterd into PATH.<size>")
    ap.add_argument("--scrape", type=int, default=0, help="nodes: the /metrics and /v1/nodes bench instead")
    ap.add_argument("--seconds", type=float, default=8.0, help="--scrape: seconds of each delta run")
    a = ap.parse_args()
    if a.scrape:
        scrape_main(a.scrape, a.procs, a.seconds)
        return
    if a.resync:
        resync_main([int(x) for x in a.resync.split(",")], a.procs, a.profile)
        return
    results = []
    with Fleet(a.procs) as fleet:
        for n in (int(x) for x in a.nodes.split(",")):
            results.append(uvloop.run(run_size(fleet, n, a.faulty_every)))
    for r in results:
        n = r["nodes"]
        print(
            f"{n:6d} nodes: RSS {r['rss_mib']:7.1f} MiB (idle {r['idle_rss_mib']:.1f})  "
            f"connect+snapshot {r['connect_s']:5.1f} s  all published {r['publish_s']:5.1f} s later  "
            f"CPU {r['busy_cpu_s']:5.1f} s  steady {r['steady_cores']:.3f} cores",
            flush=True,
        )
    print(
        "RESULT "
        + " ".join(
            f"n{r['nodes']}_rss_mib={r['rss_mib']:.0f} n{r['nodes']}_cpu_s={r['busy_cpu_s']:.1f} "
            f"n{r['nodes']}_steady_cores={r['steady_cores']:.3f}"
            for r in results
        )
    )


if __name__ == "__main__":
    main()
