"""fdol test helpers: a synthetic 4-rank job writing the record format, noded subprocesses."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from pathlib import Path

from fdol.slownode.records import encode_record
from fdol.slownode.switch import parse_switch

MS = 1_000_000


class SyntheticJob(threading.Thread):
    """Writes the records of a 4-rank job with TP groups [0,1] and [2,3] plus a global all-reduce,
    one step every ``pace_s`` of wall time (timestamps advance by the synthetic step length).

    From step ``slow_from`` rank ``slow_rank`` computes ``slow_factor`` x longer (a stall); its TP
    partner waits for it in the TP all-reduce, the other group in the global one. Honours the
    switch file like the producer (default domain / communication domain)."""

    def __init__(
        self,
        root: Path,
        job_id: str,
        *,
        switch_path: Path | None = None,
        steps: int = 200,
        pace_s: float = 0.01,
        slow_rank: int | None = None,
        slow_from: int = 30,
        slow_factor: float = 1.4,
        seed: int = 7,
    ) -> None:
        super().__init__(daemon=True)
        self.root = Path(root) / job_id
        self.switch_path = switch_path
        self.steps = steps
        self.pace_s = pace_s
        self.slow_rank = slow_rank
        self.slow_from = slow_from
        self.slow_factor = slow_factor
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.heal = threading.Event()  # set to end the slowdown
        self.step = -1
        self.next_id = 1

    def _groups(self, rank: int) -> dict:
        tp = [0, 1] if rank < 2 else [2, 3]
        key = "tp_1" if rank < 2 else "tp_2"
        return {
            key: {"group_name": "tp", "group_rank": tp.index(rank), "global_ranks": tp},
            "0": {"group_name": "default_group", "group_rank": rank, "global_ranks": [0, 1, 2, 3]},
        }

    def _rng(self, out: list[bytes], name: str, domain: str, t0: int, t1: int, device: bool = True) -> None:
        rid = self.next_id
        self.next_id += 1
        if device:
            out += [
                encode_record(16, 0, t0, rid, name, domain),
                encode_record(16, 1, t0, rid),
                encode_record(32, 1, t1, rid),
                encode_record(32, 0, t1, rid),
            ]
        else:
            out += [encode_record(2, 0, t0, rid, name, domain), encode_record(4, 0, t1, rid)]

    def run(self) -> None:
        for r in range(4):
            d = self.root / str(r)
            d.mkdir(parents=True, exist_ok=True)
            (d / "parallel_group.json").write_text(json.dumps(self._groups(r)))
        files = {r: self.root / str(r) / str(int(time.time())) for r in range(4)}
        t = time.time_ns()
        for n in range(self.steps):
            if self.stop_event.is_set():
                return
            self.step = n
            on, comm = (True, True)
            if self.switch_path is not None:
                try:
                    on, comm = parse_switch(self.switch_path.read_bytes())
                except OSError:
                    on, comm = False, False
            compute = {r: int(60 * MS * (1 + self.rng.gauss(0, 0.03))) for r in range(4)}
            if self.slow_rank is not None and n >= self.slow_from and not self.heal.is_set():
                compute[self.slow_rank] = int(compute[self.slow_rank] * self.slow_factor)
            tp_start = {r: t + 2 * MS + compute[r] for r in range(4)}
            tp_end = {}
            for g in ([0, 1], [2, 3]):
                end = max(tp_start[r] for r in g) + 2 * MS
                for r in g:
                    tp_end[r] = end
            dp_end = max(tp_end.values()) + 3 * MS
            step_end = dp_end + MS // 3
            for r in range(4):
                out: list[bytes] = []
                if on:
                    rid = self.next_id
                    self.next_id += 1
                    out += [
                        encode_record(16, 0, t, rid, f"step {n}", "default"),
                        encode_record(16, 1, t, rid),
                    ]
                    self._rng(out, "dataloader", "default", t + MS // 10, t + MS, device=False)
                    self._rng(out, "forward", "default", t + 2 * MS, tp_start[r] - 1)
                if comm:
                    tp = "tp_1" if r < 2 else "tp_2"
                    for op, g, a, b in (
                        ("AllReduce", tp, tp_start[r], tp_end[r]),
                        ("AllReduce", "0", tp_end[r] + 1, dp_end),
                    ):
                        name = json.dumps(
                            {
                                "streamId": "0",
                                "count": "265738",
                                "dataType": "float32",
                                "opName": op,
                                "groupName": g,
                            }
                        )
                        self._rng(out, name, "communication", a, b)
                if on:
                    out += [encode_record(32, 1, step_end, rid), encode_record(32, 0, step_end, rid)]
                if out:
                    with open(files[r], "ab") as fh:
                        fh.write(b"".join(out))
            t = step_end + MS // 2
            time.sleep(self.pace_s)


def http(base: str, method: str, path: str, body=None):
    """(status, decoded JSON) of an HTTP call to ``base`` (host:port)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://{base}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
