"""Slow-network diagnosis quality and speed (issues 6, 16 and 18).

Injects each fault type of the fabric simulator on a super pod of 8 nodes x 16 NPUs (4 switch
planes), one random instance per trial, after a healthy warm-up, on a fabric with real jitter
(``"jitter_model": "real"`` of :mod:`noded.pingmesh.fabric`: per-path base spread, heavy-tailed
outlier packets, 10-packet loss bursts, plane queueing under training load that changes every
period) and 0.02 % background packet loss; each period every probed path sends 100 packets (10
rounds of 10, as hccsping does with task_interval 1 s and a 10 s period). Fault types: dead NPU,
lossy link (5-30 %), slow link (+5-30 µs), dead node, degraded plane (10-30 % loss), flapping link
(down/up per round), slow plane under load (+4-8 µs, no loss; below ~+3.3 µs a shift is under the
3-sigma threshold floor of a ~7 µs path by construction), partitioned node (inter-node paths
lost), and two simultaneous faults (two of dead NPU / lossy / slow / flapping link, apart). Per
type:

- top-1 localization accuracy: the first confirmed alarm (most paths explained) of the first
  period with one names the injected object (the NPU; the link's two NPUs; the node; the plane);
  for two faults, the first period whose confirmed alarms name both (a miss when none does
  within the horizon of 5 periods);
- detection delay in periods (1 = found in the first period the fault was active) and the share
  found within 2 periods;
- false-alarm periods: healthy periods (the warm-ups) with a confirmed alarm.

The same for the RoCE parameter plane between super pods (:mod:`fdol.slownet.roce`, the fabric
of :mod:`noded.pingmesh.rocefabric`): 6 super pods x 20 nodes, 5 probing nodes per pod, real RoCE
jitter; fault types dead NPU (RoCE port), lossy link, slow link (+20-100 µs), a super pod's uplink
(10-30 % loss), the RoCE switch (10-30 % loss) and a slow uplink under load (+15-40 µs).

Then the processing time of one period (ingest + window + localization + detections + status) for
48 x 16 and 128 x 16 NPUs, beside a baseline measured in the same run on the same rows: one dict
update per row keyed by its path (the least any per-path analysis in Python does), so the figure
reads as a ratio on a loaded box. The last line holds the figures.
Usage: ``python bench/slownet_quality.py [--trials 8] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from fdol.slownet import pinglist, roce
from fdol.slownet.analyzer import AnalyzerParams, SuperPodAnalyzer
from fdol.slownet.topology import build_super_pod
from fdol.slownet.window import PingRow
from fmtools.sims.fabric import Fabric, ground_truth
from noded.pingmesh.rocefabric import RoceFabric

P_MS = 10_000
PACKETS = 100
WARMUP = 10
HORIZON = 5
BASE_LOSS = 0.0002  # background loss per packet on every path
JITTER_US = 1.0  # per-packet delay jitter (std)
KINDS = ("dead_npu", "lossy_link", "slow_link", "dead_node", "degraded_plane", "flapping_link",
         "slow_plane_load", "partitioned_node", "two_faults")  # fmt: skip
PAIRABLE = ("dead_npu", "lossy_link", "slow_link", "flapping_link")


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


def random_fault(kind: str, rng: random.Random, nodes: list[str], pairs) -> list[dict]:
    if kind == "two_faults":
        while True:
            a, b = (random_fault(k, rng, nodes, pairs)[0] for k in rng.sample(PAIRABLE, 2))
            if not _ends(a) & _ends(b):  # apart: no shared NPU
                return [a, b]
    if kind == "dead_npu":
        return [{"kind": kind, "node": rng.choice(nodes), "phy": rng.randrange(16)}]
    if kind in ("dead_node", "partitioned_node"):
        return [{"kind": kind, "node": rng.choice(nodes)}]
    if kind == "degraded_plane":
        return [{"kind": kind, "plane": rng.randrange(4), "loss": round(rng.uniform(0.1, 0.3), 3)}]
    if kind == "slow_plane_load":
        return [
            {"kind": "degraded_plane", "plane": rng.randrange(4), "loss": 0, "delay_us": rng.uniform(4, 8)}
        ]
    p = rng.choice(pairs)  # a probed link: intra-node or inter-node
    f = {
        "kind": kind,
        "a": {"node": p.src_node, "phy": p.src_phy},
        "b": {"node": p.dst_node, "phy": p.dst_phy},
    }
    if kind == "lossy_link":
        f["loss"] = round(rng.uniform(0.05, 0.3), 3)
    elif kind == "slow_link":
        f["delay_us"] = rng.uniform(5, 30)
    return [f]


def _ends(f: dict) -> set:
    if "a" in f:
        return {(f["a"]["node"], f["a"]["phy"]), (f["b"]["node"], f["b"]["phy"])}
    return {(f["node"], f.get("phy", -1))}


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
            spec = {"nodes": nodes, "npus_per_node": 16, "planes": 4, "seed": seed * 1000 + KINDS.index(kind) * 100 + t,
                    "faults": [], "base_loss": BASE_LOSS, "jitter_us": JITTER_US, "jitter_model": "real"}  # fmt: skip
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
            spec["faults"] = random_fault(kind, rng, nodes, pairs)
            fabric = Fabric(spec)
            truths = ground_truth(fabric)
            for h in range(1, HORIZON + 1):
                an.ingest(rows_for(fabric, pairs, probes, k))
                alarms = an.analyze(k).alarms
                k += 1
                if len(truths) == 1 and alarms:
                    top = sorted(alarms, key=lambda a: (-len(a.paths), -a.level))
                    hits += matches(top[0], truths[0])
                    delays.append(h)
                    break
                named = [tr for tr in truths if any(matches(a, tr) for a in alarms)]
                if len(truths) > 1 and len(named) == len(truths):  # both faults named
                    hits += 1
                    delays.append(h)
                    break
        within2 = sum(d <= 2 for d in delays) / trials
        out[kind] = (hits / trials, statistics.mean(delays) if delays else float("nan"), len(delays), within2)
    return out, false_periods, total_warm


ROCE_KINDS = ("dead_npu", "lossy_link", "slow_link", "pod_uplink", "switch", "slow_uplink_load")
ROCE_PODS, ROCE_NODES = 6, 20


def roce_fault(kind: str, rng: random.Random, plane: roce.RocePlane, pairs) -> tuple[dict, dict]:
    """(fault for the RoCE fabric, truth {kind, node, phy, peer_node, peer_phy, super_pod})."""
    if kind == "dead_npu":
        e = rng.choice([e for v in plane.pods.values() for e in v])
        return {"kind": kind, "node": e.node}, {"kind": "npu", "node": e.node, "phy": e.phy}
    if kind in ("pod_uplink", "slow_uplink_load"):
        spid = rng.choice(sorted(plane.pods))
        f = {"kind": "pod_uplink", "super_pod": spid, "loss": round(rng.uniform(0.1, 0.3), 3)}
        if kind == "slow_uplink_load":
            f.update(loss=0, delay_us=rng.uniform(15, 40))
        return f, {"kind": "superpod", "super_pod": spid}
    if kind == "switch":
        return {"kind": kind, "loss": round(rng.uniform(0.1, 0.3), 3)}, {"kind": "switch"}
    p = rng.choice(pairs)
    a, b = plane.by_sdid[p.src_sdid], plane.by_sdid[p.dst_sdid]
    f = {"kind": kind, "a": a.node, "b": b.node}
    f.update(
        {"loss": round(rng.uniform(0.05, 0.3), 3)}
        if kind == "lossy_link"
        else {"delay_us": rng.uniform(20, 100)}
    )
    return f, {"kind": "link", "node": a.node, "phy": a.phy, "peer_node": b.node, "peer_phy": b.phy}


def roce_matches(alarm, truth: dict) -> bool:
    if truth["kind"] == "superpod":
        return alarm.kind == "superpod" and alarm.src_id == f"SuperPod-{truth['super_pod']}"
    if truth["kind"] == "switch":
        return alarm.kind == "switch"
    return matches(alarm, truth)


def roce_quality(trials: int, seed: int) -> tuple[dict, int, int]:
    """The same figures for the RoCE plane: 6 super pods x 20 nodes (5 probing nodes each), real
    RoCE jitter (user-space ICMP: host hiccups, heavy tails; uplink queueing under load)."""
    rng = random.Random(seed + 7)
    out = {}
    false_periods = total_warm = 0
    pods = {str(s + 1): [f"sp{s + 1}-n{i}" for i in range(ROCE_NODES)] for s in range(ROCE_PODS)}
    for kind in ROCE_KINDS:
        hits, delays = 0, []
        for t in range(trials):
            spec = {"roce": True, "super_pods": pods, "seed": seed * 1000 + ROCE_KINDS.index(kind) * 100 + t,
                    "jitter_model": "real", "base_loss": BASE_LOSS, "faults": []}  # fmt: skip
            fabric = RoceFabric(spec)
            plane = roce.build_plane(fabric.super_pods())
            pairs = plane.pairs()
            ip = {e.sdid: e.ip for v in plane.pods.values() for e in v}
            probes = [(p.src_node, ip[p.dst_sdid]) for p in pairs]
            an = SuperPodAnalyzer(plane.sp, pairs, AnalyzerParams(period_ms=P_MS))

            def period(k, fabric=fabric, pairs=pairs, ip=ip, probes=probes, an=an, plane=plane):
                suc, fail, avg = fabric.probe_many(probes, PACKETS)
                loss = np.round(fail / PACKETS, 3).tolist()
                d = np.where(avg >= 0, np.round(avg), -1.0).tolist()
                rows = [
                    plane.to_plane_row(
                        PingRow(0, "0", ip[p.src_sdid], "0", ip[p.dst_sdid], x, x, x, lr, k * P_MS + 500)
                    )
                    for p, x, lr in zip(pairs, d, loss, strict=True)
                ]
                an.ingest(rows)
                return an.analyze(k).alarms

            k = 1000
            for _ in range(WARMUP):
                false_periods += bool(period(k))
                total_warm += 1
                k += 1
            f, truth = roce_fault(kind, rng, plane, pairs)
            spec["faults"] = [f]
            fabric = RoceFabric(spec)
            for h in range(1, HORIZON + 1):
                alarms = period(k, fabric=fabric)
                k += 1
                if alarms:
                    top = sorted(alarms, key=lambda a: (-len(a.paths), -a.level))
                    hits += roce_matches(top[0], truth)
                    delays.append(h)
                    break
        within2 = sum(d <= 2 for d in delays) / trials
        out[kind] = (hits / trials, statistics.mean(delays) if delays else float("nan"), len(delays), within2)
    return out, false_periods, total_warm


def period_time(n_nodes: int) -> tuple[float, float, int]:
    """(seconds of one period, seconds of the baseline on the same rows, rows), best of 3."""
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
        delay = (3.0 + rng.integers(0, 2, len(pairs))).tolist()
        ts = k * P_MS + 500
        return [
            PingRow(task[i], "0", src[i], "0", dst[i], delay[i], delay[i], delay[i], float(loss[i]), ts)
            for i in range(len(pairs))
        ]

    for k in range(9):
        an.ingest(rows(k))
        an.analyze(k)
    best = base = float("inf")
    for k in range(9, 12):
        batch = rows(k)
        t0 = time.perf_counter()
        acc: dict = {}
        for r in batch:  # the baseline: one dict update per row, keyed by its path
            acc[r[:5]] = r.avg_delay
        t1 = time.perf_counter()
        an.ingest(batch)
        rep = an.analyze(k)
        an.detections()
        an.status()
        t2 = time.perf_counter()
        assert rep.alarms, "the lossy path was not found"
        best, base = min(best, t2 - t1), min(base, t1 - t0)
    return best, base, len(batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t0 = time.perf_counter()
    q, fp, warm = quality(a.trials, a.seed)
    for kind, (acc, delay, detected, within2) in q.items():
        print(
            f"{kind:17s} top1={acc:.2f} detected={detected}/{a.trials} delay_periods={delay:.2f} within2={within2:.2f}"
        )
    rq, rfp, rwarm = roce_quality(a.trials, a.seed)
    for kind, (acc, delay, detected, within2) in rq.items():
        print(
            f"roce {kind:16s} top1={acc:.2f} detected={detected}/{a.trials} delay_periods={delay:.2f} within2={within2:.2f}"
        )
    speed = {}
    for n in (48, 128):
        dt, base, rows = period_time(n)
        speed[n] = (dt, base)
        print(f"{n}x16 period: {rows} rows in {dt * 1000:.0f} ms (goal {100 if n == 48 else 400} ms); "
              f"baseline (one dict update per row) {base * 1000:.0f} ms; ratio {dt / base:.1f}")  # fmt: skip
    print(
        f"false-alarm periods {fp}/{warm} HCCS, {rfp}/{rwarm} RoCE (real jitter); bench {time.perf_counter() - t0:.0f} s"
    )
    figures = " ".join(f"{k}:top1={v[0]:.2f},delay={v[1]:.2f}" for k, v in q.items())
    sp = " ".join(
        f"period_{n}x16_ms={dt * 1000:.0f} baseline_{n}x16_ms={b * 1000:.0f} ratio_{n}x16={dt / b:.1f}"
        for n, (dt, b) in speed.items()
    )
    rfig = " ".join(f"roce_{k}:top1={v[0]:.2f},delay={v[1]:.2f}" for k, v in rq.items())
    print(
        f"slownet_quality {figures} false_alarm_periods={fp}/{warm} {rfig} roce_false_alarm_periods={rfp}/{rwarm} {sp}"
    )


if __name__ == "__main__":
    main()
