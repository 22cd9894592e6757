"""The HA state ConfigMap's cost (issue 15): how many public fault records fit its bound and how
long one encode (JSON + gzip, done before every acknowledged change) and one decode (on election)
take, beside the baseline of the plain JSON dump the standalone SQLite path would need.

Records look like PubFault's: ``--nodes`` node names, 8 NPUs, random 40-bit fault ids, a resource
and a description attribute. For each count of ``--counts`` the document is encoded ``--rounds``
times (median reported).

Run (``PYTHONPATH=services``): ``.venv/bin/python bench/ha_state.py [--counts 5000,29000,50000]``. The last line holds the
figures: per count, encoded kB (bound 900 kB), encode and decode ms, and the plain JSON dump ms.
"""

from __future__ import annotations

import argparse
import random

import orjson
from benchkit import median_ms

from clusterd.kube.hastate import BLOB_KEY, DEFAULT_MAX_BYTES, decode, encode, fault_row
from faultmesh.model import Fault


def records(n: int, nodes: int, rng: random.Random) -> list[list]:
    """``n`` public fault rows as the mirror keeps them."""
    t0 = 1_796_000_000_000
    return [
        fault_row(
            Fault("pubfault", f"node-{i % nodes:05d}", "NPU", i % 8, "010001001", "SubHealthFault", "occur",
                  t0 + i * 13, t0 + i * 17,
                  {"faultId": f"fid-{rng.getrandbits(40):x}", "resource": "CCAE", "description": "link down"}),
            "public",
        )
        for i in range(n)
    ]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", default="5000,29000,50000", help="record counts, comma-separated")
    p.add_argument("--nodes", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rng = random.Random(7)
    figures = []
    for n in (int(c) for c in a.counts.split(",")):
        doc = {"version": 1, "faults": records(n, a.nodes, rng), "kv": {}, "separations": []}
        fields = encode(doc)
        size = len(fields["binaryData"][BLOB_KEY])
        cm = {**fields}
        enc = median_ms(lambda d=doc: encode(d), a.rounds)
        dec = median_ms(lambda c=cm: decode(c), a.rounds)
        base = median_ms(lambda d=doc: orjson.dumps(d), a.rounds)
        fits = "fits" if size <= DEFAULT_MAX_BYTES else "over"
        print(f"{n} records: {size / 1000:.0f} kB encoded ({fits}), encode {enc:.0f} ms, decode {dec:.0f} ms,"
              f" plain JSON dump {base:.0f} ms")  # fmt: skip
        figures.append(f"{n}: {size / 1000:.0f}kB {fits} enc={enc:.0f}ms dec={dec:.0f}ms json={base:.0f}ms")
    print(f"bound {DEFAULT_MAX_BYTES / 1000:.0f} kB | " + " | ".join(figures))


if __name__ == "__main__":
    main()
