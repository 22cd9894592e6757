"""``fault-job-info``, the ConfigMap the reference's ClusterD writes for the A3 forced release (NodeD
releases the fault super-devices' resources; reference clusterd.md §7.3, noded.md §8): the document
of one job, pure (the writer is :class:`clusterd.kube.control.ControlMaps`; the module docstring of
:mod:`clusterd.kube.control` gives the format and when it is written)."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any

Topology = Callable[[str], tuple[int, list[int]] | None]  # node -> (super pod id, SDIDs) or None


def slownet_topology(slownet) -> Topology:
    """The super-pod topology known to :class:`clusterd.slownet.component.SlowNetComponent` (its super pods'
    nodes and phy id -> SDID maps) as a :data:`Topology`."""

    def of(node: str) -> tuple[int, list[int]] | None:
        spid = slownet.node_pod.get(node)
        pod = slownet.pods.get(spid) if spid is not None else None
        n = pod.sp.nodes.get(node) if pod is not None else None
        if n is None:
            return None
        try:
            return int(spid), [n.devices[p] for p in sorted(n.devices)]
        except ValueError:
            return None

    return of


def go_json(obj: Any) -> str:
    """Compact JSON of ``obj`` in its dicts' order (Go's ``json.Marshal``: struct fields in
    declaration order; the caller builds maps with their keys sorted)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def fault_job_info(job, fault_nodes: set[str], topology: Topology, now_s: int) -> dict | None:
    """The reference's ``map[int]SuperPodFaultInfos`` of one job (see the module docstring), or
    None when some node of the job is in no known super pod (not an A3 job) or no fault node is."""
    where: dict[str, tuple[int, list[int]]] = {}
    for node in job.nodes():
        t = topology(node)
        if t is None or t[0] < 0:
            return None
        where[node] = t
    others: dict[int, list[str]] = collections.defaultdict(list)
    sdids: dict[int, list[str]] = collections.defaultdict(list)
    for node, (spid, ids) in sorted(where.items()):
        if node in fault_nodes:
            sdids[spid] += [str(i) for i in ids]
        else:
            others[spid].append(node)
    if not sdids:
        return None
    faults = {n: {} for n in sorted(fault_nodes)}
    return {  # map[int]: keys sorted as strings, as Go sorts map keys
        str(spid): {
            "SdIds": ids,
            "FaultNodes": faults,
            "NodeNames": others.get(spid) or None,
            "FaultTimes": now_s,
            "JobId": job.id,
        }  # fmt: skip
        for spid, ids in sorted(sdids.items(), key=lambda kv: str(kv[0]))
    }
