"""fdol: FD-OL (Fault Diagnose Online) for faultmesh.

``fdol.slownode`` is the slow-node library (reader, per-step metrics, node-level and cluster-level
detectors, FeatConf) hosted by noded (node part) and clusterd (cluster part). It is pure: no asyncio
and no I/O except the profiling-file reader. ``fdol.slownet`` is the slow-network part.

fdol is a pure library (issue 12): it imports nothing of faultmesh nor of any service, takes and
returns its own dataclasses, and names no fault code or level; the services convert at their edge.
"""
