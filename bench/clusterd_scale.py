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
state, and the agents reconnect with the same snapshot (unchanged) and then with every fault
changed. Agents are played by :class:`loadgen.Fleet` worker processes; beside each figure it prints
the clients' CPU, the same job against :class:`loadgen.EchoServer` (a server doing no work) and the
per-agent time relative to the first size, so the figures read as ratios on a noisy box.

``--scrape 16384`` fills clusterd with N nodes x 10 NPU faults (agents as above), then times
``GET /metrics`` and ``GET /v1/nodes`` (median of 5; the same at 1/16 of the size is the baseline
beside it) and the agent-stream delta rate with and without both scraped once per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request

import grpc
import kmock
import uvloop
from benchkit import Clusterd
from loadgen import EchoServer, Fleet, quantile
from loadgen import cpu_s as proc_cpu_s
from loadgen import rss_mib as proc_rss_mib

from faultmesh._pb import agent_pb2, agent_pb2_grpc

CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / CLK


def snapshot(node: str, faulty: bool) -> agent_pb2.Snapshot:
    devices = [
        agent_pb2.DeviceState(
            device_type="NPU",
            device_id=i,
            phy_id=i,
            health="Healthy",
            network_health="Healthy",
            level="NotHandleFault",
            super_pod_id=-1,
            server_index=-1,
        )
        for i in range(16)
    ]
    faults = []
    if faulty:
        faults = [
            agent_pb2.Fault(
                source="dcmi", node=node, device_type="NPU", device_id=3, code="80E18008", level="RestartNPU"
            ),
            agent_pb2.Fault(
                source="dcmi",
                node=node,
                device_type="NPU",
                device_id=5,
                code="81078603",
                level="PreSeparateNPU",
            ),
        ]
    return agent_pb2.Snapshot(seq=1, faults=faults, devices=devices)


async def connect_agents(addr: str, n: int, faulty_every: int) -> tuple[list, list, float]:
    per_channel = 50
    channels = [
        grpc.aio.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range((n + per_channel - 1) // per_channel + n // faulty_every // per_channel + 1)
    ]
    calls = []
    retries = [0]
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(512)

    async def agent(i: int, kind: str, ch) -> None:
        node = f"node-{i:05d}"
        for attempt in range(5):  # an overloaded machine may fail a stream: reconnect, as agents do
            async with sem:
                call = agent_pb2_grpc.AgentStreamStub(ch).Connect()
                try:
                    await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, agent=kind)))
                    if kind == "deviced":
                        snap = snapshot(node, i % faulty_every == 0)
                    else:
                        snap = agent_pb2.Snapshot(
                            seq=1,
                            node_status="UnHealthy",
                            faults=[
                                agent_pb2.Fault(
                                    source="bmc-oem",
                                    node=node,
                                    device_type="Disk",
                                    device_id=1,
                                    code="2C000031",
                                    level="SeparateFault",
                                )
                            ],
                        )
                    await call.write(agent_pb2.AgentMessage(snapshot=snap))
                    msg = await call.read()
                    assert msg.ack.seq == 1 and not msg.ack.error, msg
                    calls.append(call)
                    return
                except grpc.aio.AioRpcError:
                    call.cancel()
                    retries[0] += 1
            await asyncio.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"agent {node}/{kind} could not connect")

    jobs = [agent(i, "deviced", channels[i // per_channel]) for i in range(n)]
    base = (n + per_channel - 1) // per_channel
    jobs += [
        agent(i, "noded", channels[base + k // per_channel]) for k, i in enumerate(range(0, n, faulty_every))
    ]
    await asyncio.gather(*jobs)
    if retries[0]:
        print(f"  ({retries[0]} agent streams had to reconnect)", flush=True)
    return channels, calls, time.perf_counter() - t0


def published_nodes(emu) -> int:
    total = 0
    for (res, _ns, name), obj in list(emu.objects.items()):
        if res.plural == "configmaps" and name.startswith("cluster-info-device-") and not obj.deleted:
            value = (obj.get("data") or {}).get(name) or ""
            total += value.count('"CmName":"mindx-dl-deviceinfo-')  # cheap: no parse on kmock's loop
    return total


async def run_size(n: int, faulty_every: int) -> dict:
    state = tempfile.mkdtemp(prefix="fm-scale-")
    async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as srv:
        emu.resources["v1/configmaps"] = {}
        emu.resources["v1/nodes"] = {}
        emu.resources["v1/pods"] = {}
        for i in range(n):
            name = f"node-{i:05d}"
            emu.objects[(kmock.resource("v1/nodes"), None, name)] = {"metadata": {"name": name}}
        grpc_addr, http_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "clusterd",
            "--grpc-addr",
            grpc_addr,
            "--http-addr",
            http_addr,
            "--state-dir",
            state,
            "--kube",
            "--kube-api",
            str(srv.url).rstrip("/"),
            "--kube-min-write-s",
            "1",
            "--log-level",
            "WARNING",
        )
        try:
            for _ in range(200):
                try:
                    await asyncio.to_thread(urllib.request.urlopen, f"http://{http_addr}/readyz", timeout=1)
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            idle_rss = rss_mib(proc.pid)
            cpu0 = cpu_s(proc.pid)
            channels, calls, connect_s = await connect_agents(grpc_addr, n, faulty_every)
            t0 = time.perf_counter()
            while published_nodes(emu) < n:
                await asyncio.sleep(1.0)
                if time.perf_counter() - t0 > 180:
                    metrics = await asyncio.to_thread(
                        lambda: (
                            urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=5).read().decode()
                        )
                    )
                    kube = "\n".join(
                        line for line in metrics.splitlines() if "kube" in line and not line.startswith("#")
                    )
                    raise TimeoutError(
                        f"only {published_nodes(emu)} of {n} nodes published; clusterd:\n{kube}"
                    )
            publish_s = time.perf_counter() - t0
            busy_cpu = cpu_s(proc.pid) - cpu0
            loaded_rss = rss_mib(proc.pid)
            c1 = cpu_s(proc.pid)
            await asyncio.sleep(5)
            steady_cores = (cpu_s(proc.pid) - c1) / 5
            for call in calls:
                call.cancel()
            for ch in channels:
                await ch.close()
        finally:
            proc.terminate()
            await proc.wait()
            shutil.rmtree(state, ignore_errors=True)
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
        echo = fleet.run("resync", items, addr=srv.addr, **job)
        fleet.close_streams()
    state = tempfile.mkdtemp(prefix="fm-resync-")
    try:
        with Clusterd(state_dir=state) as cd:
            first = fleet.run("resync", items, addr=cd.grpc, **job)
            fleet.close_streams()
        with Clusterd(state_dir=state, profile=profile) as cd:
            c0 = proc_cpu_s(cd.pid)
            same = fleet.run("resync", items, addr=cd.grpc, **job)
            same_cpu = proc_cpu_s(cd.pid) - c0
            fleet.close_streams()
            c0 = proc_cpu_s(cd.pid)
            changed = fleet.run("resync", items, addr=cd.grpc, changed=True, **job)
            changed_cpu = proc_cpu_s(cd.pid) - c0
            rss = proc_rss_mib(cd.pid)
            fleet.close_streams()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return {
        "nodes": n,
        "echo_s": echo["wall_s"],
        "first_s": first["wall_s"],
        "resync_s": same["wall_s"],
        "resync_cpu_s": same_cpu,
        "changed_s": changed["wall_s"],
        "changed_cpu_s": changed_cpu,
        "client_cpu_s": same["cpu_s"],
        "p99_s": quantile(same["lat"], 0.99),
        "rss_mib": rss,
        "retries": same["retries"] + changed["retries"],
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
                f"{r['resync_cpu_s']:5.2f} s, p99 {r['p99_s']:.2f} s) | changed {r['changed_s']:6.2f} s "
                f"(CPU {r['changed_cpu_s']:5.2f} s) | first {r['first_s']:6.2f} s | echo server "
                f"{r['echo_s']:5.2f} s | RSS {r['rss_mib']:6.1f} MiB | clients {fleet.procs} procs, "
                f"CPU {r['client_cpu_s']:5.2f} s | per agent x{per_agent:.2f} of {base['nodes']} "
                f"| retries {r['retries']}",
                flush=True,
            )
    print(
        "RESULT "
        + " ".join(
            f"n{r['nodes']}_resync_s={r['resync_s']:.2f} n{r['nodes']}_vs_echo={r['resync_s'] / r['echo_s']:.1f} "
            f"n{r['nodes']}_unchanged_cpu_vs_changed={r['resync_cpu_s'] / max(r['changed_cpu_s'], 1e-9):.2f} "
            f"n{r['nodes']}_rss_mib={r['rss_mib']:.0f}"
            for r in results
        )
    )


def _get_s(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        r.read()
    return time.perf_counter() - t


def scrape_size(fleet: Fleet, n: int, seconds: float) -> dict:
    """Scrape times (s) at ``n`` nodes x 10 faults and the delta rate with / without scraping."""
    import statistics
    import threading

    with Clusterd() as cd:
        fleet.run("resync", list(range(n)), addr=cd.grpc, npus=16, faults=10, faulty_every=1)
        times = {}
        for path in ("/metrics", "/v1/nodes"):
            times[path] = statistics.median(_get_s(f"http://{cd.http}{path}") for _ in range(5))
        agents = list(range(200))
        quiet = fleet.run("deltas", agents, addr=cd.grpc, seconds=seconds, window=4)
        stop = threading.Event()

        def scraper() -> None:
            while not stop.wait(1.0):
                for path in ("/metrics", "/v1/nodes"):
                    _get_s(f"http://{cd.http}{path}")

        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        try:
            busy = fleet.run("deltas", agents, addr=cd.grpc, seconds=seconds, window=4)
        finally:
            stop.set()
            th.join(60)
        fleet.close_streams()
    return {"nodes": n, "metrics_s": times["/metrics"], "nodes_s": times["/v1/nodes"],
            "quiet_rate": quiet["n"] / quiet["wall_s"], "scraped_rate": busy["n"] / busy["wall_s"]}  # fmt: skip


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
    for n in (int(x) for x in a.nodes.split(",")):
        r = uvloop.run(run_size(n, a.faulty_every))
        results.append(r)
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
