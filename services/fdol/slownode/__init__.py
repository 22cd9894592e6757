"""FD-OL slow-node detection (reference fdol.md §1–7), as a pure library.

Modules:
- :mod:`.records` — marker records of the lightweight-profiling format (§1.3) and the bad-input counter.
- :mod:`.reader` — incremental tail of a rank directory (rotation, partial lines) and parallel_group.json.
- :mod:`.metrics` — per-step metrics per rank (§2): step time, ZP/PP device+host, dataloader, compute.
- :mod:`.featconf` — FeatConf parsing and validation (§7).
- :mod:`.detect` — time-dimension detector and homogenization (§4.3, §4.5).
- :mod:`.pattern` — faultmesh's compute-straggler pattern detector (compute ratio x partner wait ratio).
- :mod:`.node` — node-level rounds (§4).
- :mod:`.cluster` — cluster-level merge (§5) and the confirmation state machine (§6).
- :mod:`.switch` — the data-trace profiling switch (§1.1).
"""
