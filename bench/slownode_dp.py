"""Slow-node detection on data-parallel / FSDP / mixture-of-experts jobs (bench/trainsim_dp.py: no
TP group), faultmesh's rules beside the reference's rules in the same run (issue 34).

Kinds (how they are modelled and the literature: bench/trainsim_dp.py):

- ``ddp_*``: DDP, gradient all-reduce buckets overlapped with the backward, default group only;
- ``fsdp_*``: FSDP full shard, per-layer all-gathers (prefetched one ahead) and reduce-scatters, a
  labelled ``dp`` group;
- ``moe_*``: the same with mixture-of-experts layers (expert parallel over each node, dispatch and
  combine all-to-alls); ``skew``: token-routing skew only (each layer and step a few random ranks
  compute their experts 1.2-1.8x longer); ``skew_card+25%``: the skew and one +25 % card;
- ``card+20%`` / ``card+10%`` / ``card+5%``: one card's compute slower from step ``ONSET`` on;
  ``two_cards+20%``: two cards at once (both must be named);
- ``restart``: the job restarts at step ``RESTART`` on a new placement (steps from 1 again, a
  warm-up; bench/trainsim_dp.py), the card slows ``ONSET - RESTART`` steps later: its baselines
  re-form on those steps only (a fresh job has ``ONSET``), nobody may be named across the restart.

Every job runs ``STEPS`` steps through the whole path (records, parallel_group.json, reader,
per-step assembler) and the rounds of bench/slownode_realistic.py (``ROUND_STEPS`` steps a round,
every node's round, the cluster merge, the confirmation state machine; the same judging: correct,
wrong, missed, false alarm). Seconds to confirm: rounds from the onset round to the confirming one
x ``ROUND_S`` (30 s: the reference's ``nSecondsDoOneDetection``), i.e. as if a round held 30 s of
steps; the bench compresses a round to ``ROUND_STEPS`` steps.

Usage: ``python bench/slownode_dp.py [--seeds 2] [--seed-base 0] [--sizes 8,16,32] [--noise 1.0]
[--moe-p 0.2] [--card-sd 0.01] [--only ddp_card+20%,...]``; ``--noise`` / ``--moe-p`` /
``--card-sd`` check the rules on other noise levels, routing skews and speed spreads of the
cards than the modelled ones. Last line: the summary.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slownode_realistic import FAULTMESH, ONSET, REFERENCE, STEPS, Tally, detect, steps_of  # noqa: E402
from trainsim_dp import DPConf, DPLayout, DPSim  # noqa: E402
from trainsim_tp import Fault  # noqa: E402

from fdol.slownode.featconf import parse_featconf  # noqa: E402

ROUND_S = 30

# name -> (mode, moe, fault kind, factor)
SCENARIOS: dict[str, tuple[str, bool, str, float]] = {
    "ddp_healthy": ("ddp", False, "none", 1.0),
    "ddp_card+20%": ("ddp", False, "card", 1.20),
    "ddp_card+10%": ("ddp", False, "card", 1.10),
    "ddp_card+5%": ("ddp", False, "card", 1.05),
    "fsdp_healthy": ("fsdp", False, "none", 1.0),
    "fsdp_card+20%": ("fsdp", False, "card", 1.20),
    "fsdp_card+10%": ("fsdp", False, "card", 1.10),
    "fsdp_card+5%": ("fsdp", False, "card", 1.05),
    "moe_ddp_skew": ("ddp", True, "none", 1.0),
    "moe_ddp_skew_card+25%": ("ddp", True, "card", 1.25),
    "moe_fsdp_skew": ("fsdp", True, "none", 1.0),
    "moe_fsdp_skew_card+25%": ("fsdp", True, "card", 1.25),
    "ddp_two_cards+20%": ("ddp", False, "card", 1.20),
    "fsdp_two_cards+20%": ("fsdp", False, "card", 1.20),
    "ddp_restart": ("ddp", False, "none", 1.0),
    "ddp_restart_card+20%": ("ddp", False, "card", 1.20),
    "fsdp_restart_card+20%": ("fsdp", False, "card", 1.20),
    "moe_fsdp_restart_skew_card+25%": ("fsdp", True, "card", 1.25),
}
RESTART = 12  # ``*restart*``: the job restarts at this step (steps from 1 again, a new placement)


NOISE_FIELDS = ("op_noise", "step_noise", "hiccup_ms")


def make_sim(
    name: str, n: int, seed: int, noise: float = 1.0, moe_p: float | None = None, card_sd: float | None = None
) -> DPSim:
    """The scenario's job of ``n`` ranks (the culprit drawn from the seed); ``noise`` scales
    :data:`NOISE_FIELDS` of its DPConf (per-layer and per-step noise, hiccups); ``moe_p``: the
    share of hot ranks per MoE layer and step, ``card_sd``: the cards' speed spread (None:
    DPConf's)."""
    mode, moe, kind, factor = SCENARIOS[name]
    target = random.Random(seed * 31 + n).randrange(n)
    conf = DPConf(seed=seed * 1009 + n)
    conf = DPConf(**{**conf.__dict__, **{k: getattr(conf, k) * noise for k in NOISE_FIELDS}})
    if moe_p is not None:
        conf.moe_p = moe_p
    if card_sd is not None:
        conf.card_sd = card_sd
    sim = DPSim(DPLayout(n, mode, moe), conf, Fault(kind, target, factor, onset=ONSET))
    if "two_cards" in name:
        sim.second = (target + 1 + random.Random(seed * 37 + n).randrange(n - 1)) % n
    if "restart" in name:
        sim.restart_at = RESTART
    sim.n_steps = STEPS  # type: ignore[attr-defined]
    return sim


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--sizes", default="8,16,32")
    ap.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    ap.add_argument(
        "--noise", type=float, default=1.0, help="scale of the simulator's noise (1: as modelled)"
    )
    ap.add_argument("--moe-p", type=float, default=None, help="share of hot ranks per MoE layer and step")
    ap.add_argument(
        "--card-sd", type=float, default=None, help="the cards' speed spread (standard deviation)"
    )
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    seeds = range(args.seed_base, args.seed_base + args.seeds)
    confs = {"faultmesh": parse_featconf(FAULTMESH), "reference": parse_featconf(REFERENCE)}
    only = set(args.only.split(",")) - {""}
    t_start = time.perf_counter()
    print(
        f"seeds {seeds.start}..{seeds.stop - 1}, sizes {args.sizes}, noise x{args.noise:g}, "
        f"moe_p {args.moe_p if args.moe_p is not None else DPConf.moe_p}, "
        f"card_sd {args.card_sd if args.card_sd is not None else DPConf.card_sd}, a round = {ROUND_S} s"
    )
    print(
        f"{'scenario':24} {'runs':>4} | "
        + " | ".join(f"{k[:9]:>9} prec recall FA  s_med s_max" for k in confs)
    )
    totals = {k: Tally() for k in confs}
    for name in SCENARIOS:
        if only and name not in only:
            continue
        tallies = {k: Tally() for k in confs}
        runs = 0
        for n in sizes:
            for seed in seeds:
                steps = steps_of(
                    make_sim(name, n, seed, args.noise, args.moe_p, args.card_sd), file_max=1 << 30
                )
                runs += 1
                for k, conf in confs.items():
                    tallies[k].add(
                        *detect(make_sim(name, n, seed, args.noise, args.moe_p, args.card_sd), steps, conf)
                    )
        cells = []
        for k, t in tallies.items():
            secs = [d * ROUND_S for d in t.delays]
            sm = f"{statistics.median(secs):.0f}" if secs else "-"
            sx = f"{max(secs)}" if secs else "-"
            cells.append(f"{'':>9} {t.precision:>4.2f} {t.recall:>6.2f} {t.fp:>2} {sm:>6} {sx:>5}")
            totals[k].merge(t)
        print(f"{name:24} {runs:>4} | " + " | ".join(cells), flush=True)
    parts = []
    for k, t in totals.items():
        secs = [d * ROUND_S for d in t.delays]
        med = statistics.median(secs) if secs else float("nan")
        parts.append(
            f"{k} precision {t.precision:.2f} recall {t.recall:.2f} false_alarms {t.fp} "
            f"(culprit-free runs {t.fa}) confirm_s_median {med:.0f}"
        )
    print(f"summary: {'; '.join(parts)}; wall_s {time.perf_counter() - t_start:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
