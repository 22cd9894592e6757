"""noded pingmesh: the HCCS task plan, a pure function of the inputs (reference noded.md §6; see
:mod:`noded.pingmesh.component`): for every chip in the topology's entry for this node that has
destinations, the destinations on the same server (SDID server id) go to task 0 and the others to
task 1, at most ``MAX_DESTS`` each; a job uid (sha256 over the address map, the config entry and the
destinations) identifies the plan."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from typing import NamedTuple

from fdol.slownet import config as pmconfig
from fdol.slownet import topology as topo

MAX_DESTS = 48

Tasks = dict[tuple[int, int], tuple[str, ...]]  # (phy id, task id) -> destinations


class Plan(NamedTuple):
    """``tasks``; ``uid`` ("" without a plan); ``activation``: the config entry of the super pod
    (None: not configured); ``cut``: the task groups cut to ``MAX_DESTS``."""

    tasks: Tasks
    uid: str
    activation: pmconfig.Activation | None
    cut: int = 0


def valid_addr(a: str) -> bool:
    """A destination address hccsping takes (non-empty, no comma, under 16 characters)."""
    return bool(a) and "," not in a and len(a) < 16


def compute_plan(
    config: dict[str, pmconfig.Activation] | None,
    topology: topo.SuperPod | None,
    ping_list: dict[int, list[str]] | None,
    super_pod_id: str | None,
    node: str,
    chips: Collection[int],
) -> Plan:
    """The plan of ``node`` (module doc) from the current inputs; ``chips``: the phy ids the backend
    has. An empty plan while an input is missing."""
    if config is None or topology is None or ping_list is None or super_pod_id is None:
        return Plan({}, "", None)
    act = pmconfig.for_super_pod(config, super_pod_id)
    me = topology.nodes.get(node)
    if act is None or me is None:
        return Plan({}, "", act)
    plan: Tasks = {}
    cut = 0
    for phy, sdid in sorted(me.devices.items()):
        if phy not in chips or phy not in ping_list:
            continue
        own_server = topo.sdid_server_id(sdid)
        groups: dict[int, list[str]] = {0: [], 1: []}
        for d in ping_list[phy]:
            same = d.isdigit() and topo.sdid_server_id(int(d)) == own_server
            groups[0 if same else 1].append(d)
        for task, dsts in groups.items():
            if len(dsts) > MAX_DESTS:
                cut += 1
                dsts = dsts[:MAX_DESTS]
            if dsts:
                plan[(phy, task)] = tuple(dsts)
    addr_map = {str(p): str(s) for p, s in sorted(me.devices.items())}
    h = hashlib.sha256()
    h.update(json.dumps(addr_map, sort_keys=True).encode())
    h.update(json.dumps({"activate": act.activate, "task_interval": act.task_interval}).encode())
    h.update(json.dumps(sorted((f"{p}/{t}", list(d)) for (p, t), d in plan.items())).encode())
    return Plan(plan, h.hexdigest(), act, cut)
