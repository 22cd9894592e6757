"""Hand-built marker records for the fdol tests (times in ns)."""

from __future__ import annotations

import json
import random

from fdol.slownode.metrics import StepMetrics
from fdol.slownode.records import Record


class Gen:
    """Builds the records of ranges the way the reference producer does (4 records with device
    stream, 2 for host-only ranges; only the first record carries Name/Domain)."""

    def __init__(self) -> None:
        self.next_id = 1
        self.records: list[Record] = []

    def rng(self, name, domain, start, end, device=True, dev_shift=0):
        rid = self.next_id
        self.next_id += 1
        if device:
            self.records += [
                Record(16, 0, start, rid, name, domain),
                Record(16, 1, start + dev_shift, rid, "", ""),
                Record(32, 1, end + dev_shift, rid, "", ""),
                Record(32, 0, end, rid, "", ""),
            ]
        else:
            self.records += [Record(2, 0, start, rid, name, domain), Record(4, 0, end, rid, "", "")]
        return rid

    def comm(self, op, group, start, end, count=1024):
        name = json.dumps(
            {"streamId": "1", "count": str(count), "dataType": "fp32", "opName": op, "groupName": group}
        )
        return self.rng(name, "communication", start, end)

    def step(self, n, start, dur, *, fwd=None, dl=None, tp=None, pp=None, tp_group="tp_1", pp_group="pp_2"):
        """One step: records ordered by time like a real producer (start, inner ranges, end).

        ``fwd``/``dl``: durations; ``tp``: list of TP all-reduce durations; ``pp``: list of send durations.
        """
        rid = self.next_id
        self.next_id += 1
        recs = [Record(16, 0, start, rid, f"step {n}", "default"), Record(16, 1, start, rid, "", "")]
        self.records += recs
        t = start + 1
        if dl:
            self.rng("dataloader", "default", t, t + dl, device=False)
            t += dl + 1
        if fwd:
            self.rng("forward", "default", t, t + fwd)
            t += fwd + 1
        for d in tp or []:
            self.comm("HcclAllReduce", tp_group, t, t + d)
            t += d + 1
        for d in pp or []:
            self.comm("HcclSend", pp_group, t, t + d)
            t += d + 1
        end = start + dur
        assert end >= t, "step too short for its ranges"
        self.records += [Record(32, 1, end, rid, "", ""), Record(32, 0, end, rid, "", "")]
        return end


def dp_history(n, steps, slow=None, factor=1.1, ops=6, seed=0, skip=()):
    """Per rank, steps whose k-th data-parallel collective is reached after (k+1) x 10 ms of the
    rank's compute (2 % noise each); ``skip``: (rank, step) pairs recorded without one collective."""
    rng = random.Random(seed)
    hist = {r: [] for r in range(n)}
    for s in range(steps):
        for r in range(n):
            f = factor if r == slow else 1.0
            t, starts = 0.0, []
            for _ in range(ops):
                t += 10 * 1_000_000 * f * (1 + rng.gauss(0, 0.02))
                starts.append(int(t))
            if (r, s) in skip:
                starts.pop()
            hist[r].append(StepMetrics(r, s, 0, 0, step_time=int(t) + 1_000_000, dp_starts=tuple(starts)))
    return hist
