"""FD-OL slow network (netfault): the pure library behind clusterd's pingmesh analysis.

- :mod:`fdol.slownet.topology` — super-pod topology, SDID rules (reference noded.md §6, fdol.md §8.2);
- :mod:`fdol.slownet.pinglist` — who pings whom (fdol.md §8.3, with inter-node pairs really probed);
- :mod:`fdol.slownet.window` — sliding window of periods and thresholds (fdol.md §8.6);
- :mod:`fdol.slownet.localize` — NPU / link / node / plane localization (fdol.md §8.7);
- :mod:`fdol.slownet.suppress` — alarm suppression by key (fdol.md §8.7);
- :mod:`fdol.slownet.analyzer` — one super pod's analysis per period, alarms -> fault records (§8.8).

No I/O and no asyncio here; numpy for the per-period arithmetic.
"""
