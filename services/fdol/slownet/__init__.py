"""FD-OL slow network (netfault): the pure library behind clusterd's pingmesh analysis.

- :mod:`fdol.slownet.topology` — super-pod topology, SDID rules (reference noded.md §6, fdol.md §8.2);
- :mod:`fdol.slownet.pinglist` — who pings whom (fdol.md §8.3, with inter-node pairs really probed);
- :mod:`fdol.slownet.window` — sliding window of periods and thresholds (fdol.md §8.6);
- :mod:`fdol.slownet.localize` — NPU / link / node / plane localization (fdol.md §8.7);
- :mod:`fdol.slownet.suppress` — alarm suppression by key (fdol.md §8.7);
- :mod:`fdol.slownet.analyzer` — one super pod's analysis per period, alarms -> detections (§8.8);
- :mod:`fdol.slownet.config` — pingmesh-config; :mod:`fdol.slownet.csvfile` — the result CSV.

Its own dataclasses in and out (``SuperPod``, ``PingPair``, ``NodePingList``, ``PingRow``,
``PingRecord``, ``Activation``, ``Alarm``, ``SlowNetDetection``): no protobuf, no fault records,
codes or levels — clusterd and noded convert at their edge (``clusterd.detectors.fdol_edge``,
``noded.pingmesh.wire``). No asyncio; the only I/O is :func:`fdol.slownet.csvfile.read_csv_rows`;
numpy for the per-period arithmetic.
"""
