"""Slow-node detection quality on labelled synthetic jobs, and the cost of one detection round.

Scenarios (ranks 8..1024, TP groups of 8 = one node, PP groups across nodes, compute noise 3 % on
even seeds and 8 % on odd seeds):
slow compute card (+50 % compute, step time rises over the 30 % gate), compute straggler (+20 %:
under the gate — only faultmesh's pattern detector can see it), slow TP domain, slow PP link, slow
host, slow dataloader, transient spikes (2 slow steps) and no fault. Each job runs 50 normal steps,
then the fault from step 50 to 120; a detection round runs every 5 steps (node rounds, cluster
merge, confirmation after 5 consecutive slow rounds). A detection is *correct* when the confirmed
cluster result names the faulty entity (rank / TP group / PP link / host / IO rank); a confirmation
naming anything else, or any confirmation in a no-fault or transient job, is a false alarm.

A job of one node (8 ranks) has one TP domain and one host: a slow TP domain or host there is the
whole job running slower, which no peer comparison can tell from a job-wide slowdown (a slower
network or storage for everyone: bench/slownode_realistic.py ``all_*``, where nothing may be
named); those runs expect nobody named (a naming is a false alarm), as a culprit-free job.

The slow host / IO / TP domain / PP link faults add 25-35 ms to a ~75 ms step, near the 30 %
step-time gate of the reference rules; with 8 % noise the step-time baseline is wider and some
of them stay under the gate (missed, not misnamed).

Prints per scenario: runs, correct detections, false alarms, precision, recall, F1, mean detection
delay (steps after onset); then the cost of one round for 1024 ranks (ms, peak RSS) and the
reader + per-step metrics throughput. Last line: the summary figures. Runs in well under a minute.

Usage: ``python bench/slownode_quality.py [--seeds 3] [--sizes 8,64,256,1024]``
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from fdol.slownode.cluster import ClusterDetector, DegradationTracker
from fdol.slownode.featconf import parse_featconf
from fdol.slownode.metrics import StepAssembler, StepMetrics
from fdol.slownode.node import NodeDetector
from fdol.slownode.reader import Group, JobReader
from fdol.slownode.records import encode_record

MS = 1_000_000
TP = 8
PP_STAGES = 4
ONSET = 50
STEPS = 120
ROUND_STEPS = 5
NOISE = (0.03, 0.08)  # compute noise (std/mean) of even / odd seeds; step-time noise is a third of it
SCENARIOS = (
    "compute_card",
    "compute_straggler",
    "tp_domain",
    "pp_link",
    "host",
    "dataloader",
    "transient",
    "none",
)


def layout(n: int) -> tuple[list[list[int]], list[list[int]]]:
    """TP groups (one node each) and PP groups (same TP index across consecutive nodes)."""
    tp = [list(range(i, i + TP)) for i in range(0, n, TP)]
    nodes = n // TP
    stages = PP_STAGES if nodes % PP_STAGES == 0 else 1
    pp = []
    if stages > 1:
        for replica in range(nodes // stages):
            for t in range(TP):
                pp.append([(replica * stages + s) * TP + t for s in range(stages)])
    return tp, pp


def generate(kind: str, n: int, rng: random.Random, noise: float = 0.03):
    """Per-step metrics of every rank and the ground truth: (steps[n][rank] -> StepMetrics, truth)."""
    tp, pp = layout(n)
    target_node = rng.randrange(n // TP)
    target_rank = target_node * TP + rng.randrange(TP)
    senders = [g[i] for g in pp for i in range(len(g) - 1)]
    target_send = rng.choice(senders) if senders else target_rank
    truth = {
        "compute_card": target_rank,
        "compute_straggler": target_rank,
        "tp_domain": tuple(tp[target_node]),
        "pp_link": target_send,
        "host": f"node-{target_node}",
        "dataloader": target_rank,
    }.get(kind)
    if kind == "pp_link" and not senders:
        truth = None
    if kind in ("tp_domain", "host") and n // TP < 2:
        truth = None  # the job's only TP domain / host: a job-wide slowdown, nobody to name
    out = []
    for step in range(STEPS):
        on = step >= ONSET
        spike = kind == "transient" and step in (ONSET, ONSET + 1)
        c = [60 * MS * (1 + rng.gauss(0, noise)) for _ in range(n)]
        dl = [1 * MS * (1 + rng.gauss(0, 0.05)) for _ in range(n)]
        ppd = [0.0] * n
        for g in pp:
            for r in g[:-1]:
                ppd[r] = 5 * MS * (1 + rng.gauss(0, 0.05))
        extra = 0.0
        if on and kind == "compute_card":
            c[target_rank] *= 1.5
        if on and kind == "compute_straggler":
            c[target_rank] *= 1.2
        if on and kind == "dataloader":
            dl[target_rank] += 30 * MS
        if on and kind == "pp_link" and truth is not None:
            ppd[target_send] *= 8
        zp = [0.0] * n
        for gi, g in enumerate(tp):
            m = max(c[r] + dl[r] for r in g)
            for r in g:
                zp[r] = m - c[r] - dl[r] + 5 * MS * (1 + rng.gauss(0, 0.05))
                if on and kind == "tp_domain" and gi == target_node:
                    zp[r] += 30 * MS
        zph = [z + 0.2 * MS for z in zp]
        if on and kind == "host":
            for r in tp[target_node]:
                zph[r] = zp[r] * 2.5 + 20 * MS
            extra += 25 * MS
        if on and kind == "tp_domain":
            extra += 30 * MS
        t = max(c[r] + dl[r] for r in range(n)) + 5 * MS + max(ppd) + extra
        if spike:
            t *= 1.6
        row = []
        for r in range(n):
            st = t * (1 + rng.gauss(0, noise / 3))
            row.append(
                StepMetrics(
                    r,
                    step,
                    0,
                    0,
                    step_time=int(st),
                    zp_device=int(zp[r]),
                    zp_host=int(zph[r]),
                    pp_device=int(ppd[r]),
                    pp_host=int(ppd[r] + 0.1 * MS),
                    dataloader_host=int(dl[r]),
                    compute=int(c[r]),
                    comm_wait=int(zp[r] + ppd[r]),
                )
            )
        out.append(row)
    return out, truth, tp, pp


def names(kind: str, truth, res: dict) -> bool:
    """Does one cluster result name the faulty entity?"""
    if kind == "tp_domain":
        return list(truth) in res["slowCommunicationDomains"]
    if kind == "pp_link":
        return any(d[0] == truth and len(d) == 2 for d in res["slowCommunicationDomains"])
    if kind == "host":
        return truth in res["slowHostNodes"]
    if kind == "dataloader":
        return truth in res["slowIORanks"]
    return False


def correct(kind: str, truth, reported: list[int], window: list[dict]) -> bool:
    """Is the confirmation right? Compute kinds: the reported (majority) ranks are exactly the slow
    rank. Other kinds: the entity is named in a majority of the confirming rounds' results."""
    if kind in ("compute_card", "compute_straggler"):
        return reported == [truth]
    return 2 * sum(names(kind, truth, r) for r in window) > len(window)


def build_nodes(conf, n, tp, pp):
    groups: dict[str, Group] = {}
    for i, g in enumerate(tp):
        groups[f"tp_{i}"] = Group(f"tp_{i}", "tp", tuple(g))
    for i, g in enumerate(pp):
        groups[f"pp_{i}"] = Group(f"pp_{i}", "pp", tuple(g))
    nodes = {}
    for i in range(n // TP):
        local = set(range(i * TP, (i + 1) * TP))
        nd = NodeDetector(conf, sorted(local), f"node-{i}")
        # as in production: the union of the local ranks' parallel_group.json files
        nd.groups = {k: g for k, g in groups.items() if local.intersection(g.global_ranks)}
        nodes[f"node-{i}"] = nd
    return nodes


def run_job(
    kind: str, n: int, seed: int, conf, round_ms: list[float] | None = None
) -> tuple[str, int | None]:
    """-> (outcome: correct | wrong | missed | false_alarm | quiet, delay in steps or None).

    ``round_ms`` collects the wall time of each full round (all node rounds + cluster merge)."""
    rng = random.Random(seed * 7919 + n)
    steps, truth, tp, pp = generate(kind, n, rng, NOISE[seed % len(NOISE)])
    nodes = build_nodes(conf, n, tp, pp)
    cluster = ClusterDetector(conf.job_id)
    tracker = DegradationTracker(conf)
    window: deque[dict] = deque(maxlen=conf.n_confirm_rounds)
    for upto in range(ROUND_STEPS - 1, STEPS, ROUND_STEPS):
        for s in range(upto - ROUND_STEPS + 1, upto + 1):
            for m in steps[s]:
                nodes[f"node-{m.rank // TP}"].add(m)
        t0 = time.perf_counter()
        for name, nd in nodes.items():
            res = nd.round()
            if res is not None:
                cluster.add_report(name, res)
        res = cluster.round()
        if round_ms is not None and upto >= ONSET:
            round_ms.append((time.perf_counter() - t0) * 1000)
        if res is None:
            continue
        window.append(res) if res["isSlow"] == 1 else window.clear()
        acts = tracker.on_round(res, cluster.all_baseline_ready(list(nodes)))
        confirm = [a for a in acts if a.kind == "confirm"]
        if confirm:
            if truth is None:
                return "false_alarm", None
            if upto < ONSET:
                return "false_alarm", None
            return (
                "correct" if correct(kind, truth, confirm[0].ranks, list(window)) else "wrong"
            ), upto - ONSET
    return ("missed" if truth is not None else "quiet"), None


def reader_throughput(n_steps: int = 3000) -> float:
    """Records per second through the file reader and the per-step metrics (one rank)."""
    with tempfile.TemporaryDirectory() as d:
        rank_dir = Path(d) / "job" / "0"
        rank_dir.mkdir(parents=True)
        lines = []
        rid = 1
        t = 1_000_000_000
        for s in range(n_steps):
            lines += [encode_record(16, 0, t, rid, f"step {s}", "default"), encode_record(16, 1, t, rid)]
            sid = rid
            rid += 1
            for name, dom, dur in (
                ("forward", "default", 60 * MS),
                ('{"opName":"AllReduce","groupName":"tp_0","count":"1000"}', "communication", 5 * MS),
            ):
                lines += [
                    encode_record(16, 0, t + 1, rid, name, dom),
                    encode_record(16, 1, t + 1, rid),
                    encode_record(32, 1, t + dur, rid),
                    encode_record(32, 0, t + dur, rid),
                ]
                rid += 1
                t += dur + 2
            lines += [encode_record(32, 1, t + 10, sid), encode_record(32, 0, t + 10, sid)]
            t += 20
        (rank_dir / "1000").write_bytes(b"".join(lines))
        t0 = time.perf_counter()
        jr = JobReader(Path(d) / "job", [0], max_read_bytes=1 << 30)
        recs = jr.poll()[0]
        a = StepAssembler(0, lambda: {"tp_0": Group("tp_0", "tp", (0, 1))})
        out = a.feed(recs)
        dt = time.perf_counter() - t0
        assert len(out) == n_steps - 1
        return len(recs) / dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--sizes", default="8,32,128", help="job sizes run --seeds times per scenario")
    ap.add_argument("--big", default="1024", help="size run once for --big-scenarios (and the round cost)")
    ap.add_argument("--big-scenarios", default="compute_card,none")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    big = int(args.big)
    big_kinds = set(args.big_scenarios.split(","))
    round_ms: list[float] = []
    conf = parse_featconf({"jobName": "bench", "nSecondsDoOneDetection": 1})
    t_start = time.perf_counter()
    print(f"{'scenario':18} {'runs':>4} {'ok':>3} {'FA':>3} {'prec':>5} {'recall':>6} {'F1':>5} {'delay':>6}")
    tot_tp = tot_fp = tot_fn = 0
    for kind in SCENARIOS:
        tp_ = fp = fn = 0
        delays = []
        runs = 0
        for n in [*sizes, big]:
            seeds = args.seeds if n != big else int(kind in big_kinds)
            if kind == "pp_link" and n < TP * PP_STAGES:
                continue  # no pipeline stages at this size
            for seed in range(seeds):
                runs += 1
                outcome, delay = run_job(kind, n, seed, conf, round_ms if n == big else None)
                if outcome == "correct":
                    tp_ += 1
                    delays.append(delay)
                elif outcome == "wrong":
                    fp += 1
                    fn += 1
                elif outcome == "missed":
                    fn += 1
                elif outcome == "false_alarm":
                    fp += 1
        prec = tp_ / (tp_ + fp) if tp_ + fp else float("nan")
        rec = tp_ / (tp_ + fn) if tp_ + fn else float("nan")
        f1 = 2 * prec * rec / (prec + rec) if tp_ else (0.0 if fn else float("nan"))
        d = f"{statistics.mean(delays):.1f}" if delays else "-"
        print(f"{kind:18} {runs:>4} {tp_:>3} {fp:>3} {prec:>5.2f} {rec:>6.2f} {f1:>5.2f} {d:>6}")
        tot_tp, tot_fp, tot_fn = tot_tp + tp_, tot_fp + fp, tot_fn + fn
    ref = parse_featconf({"jobName": "bench", "nSecondsDoOneDetection": 1, "patternDetector": False})
    ref_ok = sum(
        run_job("compute_straggler", n, seed, ref)[0] == "correct"
        for n in sizes
        for seed in range(args.seeds)
    )
    print(
        f"compute_straggler with the reference rules only (pattern detector off): "
        f"{ref_ok}/{len(sizes) * args.seeds} detected"
    )
    ms = statistics.median(round_ms) if round_ms else float("nan")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rps = reader_throughput()
    prec = tot_tp / (tot_tp + tot_fp) if tot_tp + tot_fp else float("nan")
    rec = tot_tp / (tot_tp + tot_fn) if tot_tp + tot_fn else float("nan")
    print(
        f"one detection round, {big} ranks ({big // TP} nodes x {TP}): {ms:.1f} ms (median); peak RSS {rss:.0f} MB"
    )
    print(f"reader + per-step metrics: {rps / 1e3:.0f} k records/s (one rank)")
    print(
        f"summary: precision {prec:.2f} recall {rec:.2f} round_{big}_ms {ms:.1f} rss_mb {rss:.0f} "
        f"reader_krec_s {rps / 1e3:.0f} wall_s {time.perf_counter() - t_start:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
