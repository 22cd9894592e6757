"""Ingest benchmark (issues 2, 18): SendPublicFault req/s and latency (1 and 64 concurrent clients)
and durable agent-stream deltas/s (``--agents`` agents, ``--window`` deltas in flight each), then the
ack latency at half that rate (open loop), against a real clusterd process on loopback.

The clients are :class:`loadgen.Fleet` worker processes (``--procs``, default cores - 1); every
figure is printed beside the same load against :class:`loadgen.EchoServer` (a grpc.aio server
answering the same messages without any work) measured in the same run, and beside the clients'
own CPU seconds: when the clients used about ``procs`` cores, the client was the limit.

Run: ``.venv/bin/python bench/ingest.py [--seconds 8] [--agents 1000] [--per-msg 1]``. The last line
holds the figures; ``server_us_per_delta_msg`` is clusterd's CPU (all its threads) per acked Delta
message from the common start on, beside the echo server's per message (gRPC's own floor), and
``deltas_per_server_core_s`` the fault deltas one server core would take at that cost (``--per-msg``
upserts per message; a real agent coalesces the changes of one ``min_report_interval_s`` into one
Delta).
Then the half-rate run again with ``--storm-agents`` (default a tenth of ``--agents``) storm agents
beside it on nodes of their own, sending what the storm and hostile-input tests send (reconnect
loops, a replayed Delta and a seq gap, bursts of 64 Deltas, the same faults restated): the
half-rate agents' rate and ack p99 with the storm beside those without, on both servers.
clusterd runs with its per-resource and unary limiters opened up, so the server's own cost is measured.
``--profile PATH`` writes clusterd's cProfile there.
"""

from __future__ import annotations

import argparse
import threading
import time

from benchkit import Clusterd
from loadgen import EchoServer, Fleet, cpu_s, quantile

OPEN = ("--unary-qps", "1000000", "--public-fault-qps", "1000000", "--public-fault-burst", "1000000")


def measure(fleet: Fleet, addr: str, pid: int, a) -> dict[str, tuple]:
    """Every load against one server: name -> (rate/s, p50 ms, p99 ms, client CPU s, server CPU s)."""
    out: dict[str, tuple] = {}
    storm_rate: dict[str, float] = {}  # storm messages/s of a run with storm agents

    def run(name: str, job: str, items: list[int], **kw) -> dict:
        # the agents connect during the lead time; the server's CPU counts from the common start
        lead = 1.0 + len(items) / 250
        got: dict = {}
        th = threading.Thread(
            target=lambda: got.update(fleet.run(job, items, addr=addr, seconds=a.seconds, lead_s=lead, **kw))
        )
        th.start()
        time.sleep(lead)
        c0 = cpu_s(pid)
        th.join()
        r = got
        assert not r["errors"], f"{name}: {r['errors']} errors"
        rate = r["n"] / r["wall_s"]
        out[name] = (
            rate,
            quantile(r["lat"], 0.5) * 1e3,
            quantile(r["lat"], 0.99) * 1e3,
            r["cpu_s"],
            cpu_s(pid) - c0,
            (cpu_s(pid) - c0) / max(1, r["n"]) * 1e6,  # server CPU us per message
        )
        if "storm_from" in kw:
            storm_rate[name] = r.get("storm_msgs", 0) / r["wall_s"]
        return out[name]

    run("pubfault_c1", "pubfault", [0])
    run("pubfault_c64", "pubfault", list(range(64)))
    full = run("deltas", "deltas", list(range(a.agents)), window=a.window, per_msg=a.per_msg)
    half = {"rate": full[0] / 2 / a.agents, "window": 64, "per_msg": a.per_msg}
    run("deltas_half", "deltas", list(range(a.agents)), **half)
    if a.storm_agents:  # the same half-rate agents while storm agents run beside them
        items = list(range(a.agents + a.storm_agents))
        run("deltas_storm", "deltas", items, storm_from=a.agents, **half)
        out["storm_msgs_per_s"] = (storm_rate["deltas_storm"],)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--window", type=int, default=4, help="deltas in flight per agent (full-rate run)")
    ap.add_argument("--per-msg", type=int, default=1, help="upserts per Delta message")
    ap.add_argument(
        "--storm-agents",
        type=int,
        default=None,
        help="storm agents beside the half-rate run (reconnect loops, replays and gaps, bursts, "
        "duplicates; default a tenth of --agents, 0: none)",
    )
    ap.add_argument("--procs", type=int, default=None)
    ap.add_argument("--profile", default=None)
    a = ap.parse_args()
    if a.storm_agents is None:
        a.storm_agents = a.agents // 10
    with Fleet(a.procs) as fleet:
        with EchoServer() as echo:
            base = measure(fleet, echo.addr, echo.pid, a)
        with Clusterd(*OPEN, profile=a.profile) as cd:
            got = measure(fleet, cd.grpc, cd.pid, a)
    storm = got.pop("storm_msgs_per_s", (0.0,))[0]
    base.pop("storm_msgs_per_s", None)
    for name, (rate, p50, p99, ccpu, scpu, us) in got.items():
        b = base[name]
        print(
            f"{name:13s} clusterd {rate:8.0f}/s p50 {p50:7.2f} ms p99 {p99:7.2f} ms (server CPU {scpu:5.1f} s, "
            f"{us:5.0f} us/msg) | echo server {b[0]:8.0f}/s p99 {b[2]:7.2f} ms ({b[5]:5.0f} us/msg) | ratio "
            f"{rate / b[0]:.2f} | clients {fleet.procs} procs CPU {ccpu:5.1f} s of {a.seconds * fleet.procs:.0f}",
            flush=True,
        )
    d, h = got["deltas"], got["deltas_half"]
    st = got.get("deltas_storm")
    if st is not None:
        print(
            f"storm         {a.storm_agents} storm agents sent {storm:.0f} msg/s to clusterd beside the "
            f"half-rate agents: their rate x{st[0] / h[0]:.2f}, ack p99 {h[2]:.1f} -> {st[2]:.1f} ms "
            f"(echo server: x{base['deltas_storm'][0] / base['deltas_half'][0]:.2f}, "
            f"p99 {base['deltas_half'][2]:.1f} -> {base['deltas_storm'][2]:.1f} ms)",
            flush=True,
        )
    storm_fig = (
        f" storm_agents={a.storm_agents} storm_msgs_per_s={storm:.0f} storm_rate_ratio={st[0] / h[0]:.2f} "
        f"storm_ack_p99_ms={st[2]:.1f}"
        if st is not None
        else ""
    )
    print(
        f"RESULT pubfault_c1_rps={got['pubfault_c1'][0]:.0f} pubfault_c64_rps={got['pubfault_c64'][0]:.0f} "
        f"pubfault_c64_p99_ms={got['pubfault_c64'][2]:.1f} agents={a.agents} per_msg={a.per_msg} "
        f"deltas_per_s={d[0]:.0f} deltas_vs_echo={d[0] / base['deltas'][0]:.2f} server_cores={d[4] / a.seconds:.2f} "
        f"server_us_per_delta_msg={d[5]:.0f} echo_us_per_msg={base['deltas'][5]:.0f} "
        f"deltas_per_server_core_s={1e6 / d[5] * a.per_msg:.0f} half_rate_ack_p99_ms={h[2]:.1f} "
        f"client_cpu_s={d[3]:.1f}{storm_fig}"
    )


if __name__ == "__main__":
    main()
