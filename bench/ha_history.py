"""The HA history mirror's size (issue 30): how many fault-history rows and recovery decisions fit the
history ConfigMap's bound, and what one encode (JSON + gzip, once per write interval, off the event
loop) and one decode (on election) cost.

Rows look like clusterd's: ``--nodes`` node names, 8 NPUs, deviced faults with a rule attribute,
public faults with a random 40-bit fault id, operator rows with who and why, in the mix 6:3:1;
decisions are the brain's records (flow, decision, reason, state, 2 rank faults). For each
``events,decisions`` pair of ``--sizes`` the window is encoded ``--rounds`` times (median).

Run (``PYTHONPATH=services``): ``.venv/bin/python bench/ha_history.py``. The last line holds the
figures: per pair, encoded kB (bound 900 kB), encode and decode ms.
"""

from __future__ import annotations

import argparse
import random

from benchkit import median_ms

from clusterd.kube.hahistory import BLOB_KEY, decode, encode, event_row
from clusterd.kube.hastate import DEFAULT_MAX_BYTES
from faultmesh.model import Fault

T0 = 1_796_000_000_000


def events(n: int, nodes: int, rng: random.Random) -> list[list]:
    """``n`` history rows as the mirror keeps them."""
    out = []
    for i in range(n):
        node, ts = f"node-{rng.randrange(nodes):05d}", T0 + i * 997
        if i % 10 < 6:
            f = Fault("deviced", node, "NPU", i % 8, rng.choice(["80E18008", "80C98008", "8C1F8608"]), "RestartNPU",
                      attributes={"upgrade_rule": "FaultFrequency: 3 times in 3600 s -> SeparateNPU"})  # fmt: skip
        elif i % 10 < 9:
            f = Fault("pubfault", node, "NPU", i % 8, "010001001", "SubHealthFault",
                      attributes={"faultId": f"fid-{rng.getrandbits(40):x}", "resource": "CCAE"})  # fmt: skip
        else:
            f = Fault("operator", node, "Node", -1, "IsolationBreaker", "",
                      attributes={"released_by": "alice", "release_auth": "token", "release_addr": "10.0.0.7",
                                  "release_reason": "checked the table push, the chips are fine"})  # fmt: skip
        out.append(event_row(ts, rng.choice(["occur", "recover", "update"]), f))
    return out


def decisions(n: int, nodes: int, rng: random.Random) -> list[list]:
    """``n`` decision rows ([job id, record]) as the mirror keeps them."""
    flows = [
        ("process-recover", "stop-train"),
        ("process-recover", "exit-completed"),
        ("recover-in-place", "dump"),
    ]
    out = []
    for i in range(n):
        flow, decision = rng.choice(flows)
        faults = [{"rank": r, "node": f"node-{rng.randrange(nodes):05d}", "device_id": r % 8, "pod_rank": r // 8,
                   "code": "80E18008", "level": "RestartNPU", "fault_type": "1", "since_ms": T0 + i}
                  for r in rng.sample(range(4096), 2)]  # fmt: skip
        rec = {"time_ms": T0 + i * 4000, "flow": flow, "decision": decision,
               "reason": "fault ranks reported by the agents", "state": "WaitReport", "faults": faults}  # fmt: skip
        out.append([f"job-{i % 50:03d}", rec])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="5000,500 20000,2000 30000,3000", help="events,decisions pairs")
    p.add_argument("--nodes", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rng = random.Random(7)
    figures = []
    for pair in a.sizes.split():
        ne, nd = (int(x) for x in pair.split(","))
        doc = {"version": 1, "written_ms": T0, "events": events(ne, a.nodes, rng),
               "decisions": decisions(nd, a.nodes, rng)}  # fmt: skip
        fields = encode(doc)
        size = len(fields["binaryData"][BLOB_KEY])
        enc = median_ms(lambda d=doc: encode(d), a.rounds)
        dec = median_ms(lambda c=fields: decode(c), a.rounds)
        fits = "fits" if size <= DEFAULT_MAX_BYTES else "over"
        print(f"{ne} rows + {nd} decisions: {size / 1000:.0f} kB encoded ({fits}), encode {enc:.0f} ms,"
              f" decode {dec:.0f} ms")  # fmt: skip
        figures.append(f"{ne}+{nd}: {size / 1000:.0f}kB {fits} enc={enc:.0f}ms dec={dec:.0f}ms")
    print(f"bound {DEFAULT_MAX_BYTES / 1000:.0f} kB | " + " | ".join(figures))


if __name__ == "__main__":
    main()
