"""fdol: FD-OL (Fault Diagnose Online) for faultmesh.

``fdol.slownode`` is the slow-node library (reader, per-step metrics, node-level and cluster-level
detectors, FeatConf) hosted by noded (node part) and clusterd (cluster part). It is pure: no asyncio
and no I/O except the profiling-file reader. ``fdol.slownet`` is the slow-network part.
"""
