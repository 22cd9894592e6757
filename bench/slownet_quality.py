"""Slow-network diagnosis quality and speed (issue 6 "Done when").

Injects each fault type of the fabric simulator (dead NPU, lossy link, slow link, dead node,
degraded plane) on a super pod of 8 nodes x 16 NPUs (4 switch planes), one random instance per
trial (lossy link 5-30 % loss, slow link +5-30 µs, degraded plane 10-30 % loss), after a healthy
warm-up, over a background of 0.02 % packet loss and 1 µs jitter; each period every probed path sends 100 packets (10 rounds of 10,
as hccsping does with task_interval 1 s and a 10 s period). Reports per fault type:

- top-1 localization accuracy: the first alarm (most paths explained) of the first period with an
  alarm names the injected object (the NPU; the link's two NPUs; the node; the plane);
- detection delay in periods (1 = found in the first period the fault was active);
- false-alarm periods during the healthy warm-ups.

Then the processing time of one period (ingest 47,616 rows + window + localization + fault
records) for 48 nodes x 16 NPUs. Runs in well under a minute; the last line holds the figures.
Usage: ``python bench/slownet_quality.py [--trials 8] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from faultmesh.sims.fabric import Fabric, ground_truth
from fdol.slownet import pinglist
from fdol.slownet.analyzer import AnalyzerParams, SuperPodAnalyzer
from fdol.slownet.topology import build_super_pod
from fdol.slownet.window import PingRow

P_MS = 10_000
PACKETS = 100
WARMUP = 5
HORIZON = 5
BASE_LOSS = 0.0002  # background loss per packet on every path
JITTER_US = 1.0  # per-packet delay jitter (std)
KINDS = ("dead_npu", "lossy_link", "slow_link", "dead_node", "degraded_plane")


def rows_for(fabric: Fabric, pairs, probes, k: int) -> list[PingRow]:
    suc, fail, avg = fabric.probe_many(probes, PACKETS)
    loss = np.round(fail / PACKETS, 3)
    d = np.where(avg >= 0, np.round(avg), -1.0)
    ts = k * P_MS + 500
    return [
        PingRow(
            p.task_id, "0", str(p.src_sdid), "0", str(p.dst_sdid), float(x), float(x), float(x), float(lr), ts
        )
        for p, x, lr in zip(pairs, d, loss, strict=True)
    ]


def random_fault(kind: str, rng: random.Random, nodes: list[str], pairs) -> dict:
    if kind == "dead_npu":
        return {"kind": kind, "node": rng.choice(nodes), "phy": rng.randrange(16)}
    if kind == "dead_node":
        return {"kind": kind, "node": rng.choice(nodes)}
    if kind == "degraded_plane":
        return {"kind": kind, "plane": rng.randrange(4), "loss": round(rng.uniform(0.1, 0.3), 3)}
    p = rng.choice(pairs)  # a probed link: intra-node or inter-node
    f = {
        "kind": kind,
        "a": {"node": p.src_node, "phy": p.src_phy},
        "b": {"node": p.dst_node, "phy": p.dst_phy},
    }
    f.update(
        {"loss": round(rng.uniform(0.05, 0.3), 3)}
        if kind == "lossy_link"
        else {"delay_us": rng.uniform(5, 30)}
    )
    return f


def matches(alarm, truth: dict) -> bool:
    if alarm.kind != truth["kind"]:
        return False
    if alarm.kind == "npu":
        return (alarm.node, alarm.phy) == (truth["node"], truth["phy"])
    if alarm.kind == "node":
        return alarm.node == truth["node"]
    if alarm.kind == "plane":
        return alarm.plane == truth["plane"]
    return {(alarm.node, alarm.phy), (alarm.peer_node, alarm.peer_phy)} == {
        (truth["node"], truth["phy"]),
        (truth["peer_node"], truth["peer_phy"]),
    }


def quality(trials: int, seed: int) -> tuple[dict, int, int]:
    nodes = [f"node-{i}" for i in range(8)]
    rng = random.Random(seed)
    out = {}
    false_periods = total_warm = 0
    for kind in KINDS:
        hits, delays = 0, []
        for t in range(trials):
            spec = {"nodes": nodes, "npus_per_node": 16, "planes": 4, "seed": seed * 1000 + KINDS.index(kind) * 100 + t, "faults": [],
                    "base_loss": BASE_LOSS, "jitter_us": JITTER_US}  # fmt: skip
            fabric = Fabric(spec)
            sp = fabric.sp
            pairs = pinglist.generate(sp)
            probes = [(p.src_node, p.src_phy, p.dst_sdid) for p in pairs]
            an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P_MS))
            k = 1000
            for _ in range(WARMUP):
                an.ingest(rows_for(fabric, pairs, probes, k))
                if an.analyze(k).alarms:
                    false_periods += 1
                total_warm += 1
                k += 1
            spec["faults"] = [random_fault(kind, rng, nodes, pairs)]
            fabric = Fabric(spec)
            truth = ground_truth(fabric)[0]
            for h in range(1, HORIZON + 1):
                an.ingest(rows_for(fabric, pairs, probes, k))
                alarms = an.analyze(k).alarms
                k += 1
                if alarms:
                    top = sorted(alarms, key=lambda a: (-len(a.paths), -a.level))[0]
                    hits += matches(top, truth)
                    delays.append(h)
                    break
        out[kind] = (hits / trials, statistics.mean(delays) if delays else float("nan"), len(delays))
    return out, false_periods, total_warm


def period_time(n_nodes: int = 48) -> tuple[float, int]:
    sp = build_super_pod(0, [f"n{i}" for i in range(n_nodes)], planes=4)
    pairs = pinglist.generate(sp)
    an = SuperPodAnalyzer(sp, pairs, AnalyzerParams(period_ms=P_MS))
    rng = np.random.default_rng(7)
    src = [str(p.src_sdid) for p in pairs]
    dst = [str(p.dst_sdid) for p in pairs]
    task = [p.task_id for p in pairs]
    lossy = 5  # one lossy path in every period after warm-up

    def rows(k: int) -> list[PingRow]:
        loss = np.zeros(len(pairs))
        if k >= 6:
            loss[lossy] = 0.3
        delay = 3.0 + rng.integers(0, 2, len(pairs))
        ts = k * P_MS + 500
        return [
            PingRow(
                task[i],
                "0",
                src[i],
                "0",
                dst[i],
                float(delay[i]),
                float(delay[i]),
                float(delay[i]),
                float(loss[i]),
                ts,
            )
            for i in range(len(pairs))
        ]

    for k in range(9):
        an.ingest(rows(k))
        an.analyze(k)
    batch = rows(9)
    t0 = time.perf_counter()
    an.ingest(batch)
    rep = an.analyze(9)
    an.detections()
    an.status()
    dt = time.perf_counter() - t0
    assert rep.alarms, "the lossy path was not found"
    return dt, len(batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t0 = time.perf_counter()
    q, fp, warm = quality(a.trials, a.seed)
    for kind, (acc, delay, detected) in q.items():
        print(f"{kind:15s} top1={acc:.2f} detected={detected}/{a.trials} delay_periods={delay:.2f}")
    dt, n = period_time()
    print(
        f"48x16 period: {n} rows in {dt * 1000:.0f} ms; false-alarm periods {fp}/{warm}; bench {time.perf_counter() - t0:.0f} s"
    )
    figures = " ".join(f"{k}:top1={v[0]:.2f},delay={v[1]:.2f}" for k, v in q.items())
    print(f"slownet_quality {figures} false_alarm_periods={fp}/{warm} period_48x16_ms={dt * 1000:.0f}")


if __name__ == "__main__":
    main()
