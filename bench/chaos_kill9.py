"""Acked-and-lost under kill -9 with storage faults (issue 19): N rounds of real clusterd killed with
SIGKILL while PubFault senders, agents and a SQLite lock holder run; prints what was acked and what
the next clusterd lacked (both lost counts must be 0; exit status 1 otherwise).

    python bench/chaos_kill9.py --rounds 20 --load-s 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos.kill9 import run_rounds  # noqa: E402 (the harness lives with the chaos tests)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--load-s", type=float, default=3.0, help="load per round before the kill (s)")
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--seed", type=int, default=19)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-kill9-") as d:
        t = run_rounds(Path(d), rounds=a.rounds, load_s=a.load_s, agents=a.agents, seed=a.seed)
    print(f"rounds={t.rounds} storage_refusals={t.refused_writes}")
    print(f"public: acked={len(t.acked_public)} lost={len(t.lost_public)}")
    print(f"agent:  acked={t.agent_faults_acked} lost={t.agent_faults_lost} extra={t.agent_faults_extra}")
    return 0 if not t.lost_public and not t.agent_faults_lost and not t.agent_faults_extra else 1


if __name__ == "__main__":
    sys.exit(main())
