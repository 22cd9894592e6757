"""Faults -> jobs and ranks: the job fault view (clusterd.md §6.4) and the Fault service view (§2.4).

Per job, per node of the job:

- an NPU fault on a device that holds a rank makes that rank faulty with the fault's level;
- any other fault (node, CPU, storage, network, switch, or device id -1) that makes the node
  UnHealthy gives *every* rank on the node level ``SeparateNPU`` (SubHealthy: ``SubHealthFault``),
  as the reference does for NodeD and switch node states; a node ``PreSeparateFault`` gives none;
- codes hidden for a node (the stress test hides 80818C05 / 80818C06) are left out.

Rank fault types (``FaultRank.faultType``): "0" UCE 80E01801 and "2" HCCL 8C1F860B when the job has
``retry`` in its strategies, "1" otherwise. The retry filter (§6.2 "retry": a new hardware retry fault
hidden while the business plane may report it) is :mod:`clusterd.brain.retryproc`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from clusterd.brain.jobs import Job
from faultmesh.levels import HEALTHY, SUB_HEALTHY, UNHEALTHY, level_health, level_severity
from faultmesh.model import Fault

UCE_CODE = "80E01801"
HCCL_RETRY_CODE = "8C1F860B"
STRESS_HIDDEN_CODES = ("80818C05", "80818C06")
# §6.4: levels that do not make a job UnHealthy.
NOT_UNHEALTHY_LEVELS = ("SubHealthFault", "NotHandleFault", "PreSeparate", "PreSeparateNPU")
# A node (NodeD) fault of these levels creates no job fault in the reference (the iBMC alarm 0800004B
# is PreSeparateFault: the node is not used for new jobs, the running job goes on).
NODE_NO_JOB_FAULT_LEVELS = ("PreSeparateFault",)
# §7.2: levels the Recover controller ignores.
RECOVER_IGNORED_LEVELS = ("NotHandleFault", "PreSeparateNPU")


@dataclass(frozen=True, slots=True)
class RankFault:
    """One fault on one rank: rank, node, device_id, pod_rank, code, level, fault_type, since_ms."""

    rank: int
    node: str
    device_id: int
    pod_rank: int
    code: str
    level: str
    fault_type: str
    since_ms: int

    def as_dict(self) -> dict:
        return {
            "rank": self.rank,
            "node": self.node,
            "device_id": self.device_id,
            "pod_rank": self.pod_rank,
            "code": self.code,
            "level": self.level,
            "fault_type": self.fault_type,
            "since_ms": self.since_ms,
        }


def _is_node_scope(f: Fault) -> bool:
    return f.device_type != "NPU" or f.device_id < 0


def fault_type(job: Job, code: str) -> str:
    """FaultRank.faultType for ``code`` in ``job`` ("0" UCE, "2" HCCL retry, "1" normal)."""
    if "retry" in job.recover_strategy:
        if code == UCE_CODE:
            return "0"
        if code == HCCL_RETRY_CODE:
            return "2"
    return "1"


def job_rank_faults(
    job: Job,
    faults_of_node: Callable[[str], Iterable[Fault]],
    hidden: Callable[[str, Fault], bool] = lambda node, f: False,
) -> list[RankFault]:
    """Every (rank, code) fault of ``job``, sorted by rank then code (clusterd.md §6.4), without
    those ``hidden(node, fault)`` leaves out (the stress-test and custom filters)."""
    out: dict[tuple[int, str], RankFault] = {}
    for node in job.nodes():
        ranks = job.ranks_on(node)
        pod_rank = job.pod_rank(node)
        for f in faults_of_node(node):
            if hidden(node, f):
                continue
            if _is_node_scope(f):
                h = level_health(f.level)
                if h == HEALTHY or f.level in NODE_NO_JOB_FAULT_LEVELS:
                    continue
                level = "SeparateNPU" if h == UNHEALTHY else "SubHealthFault"
                targets = ranks
            else:
                level = f.level
                targets = [r for r in ranks if r.device_id == f.device_id]
            for r in targets:
                key = (r.rank, f.code)
                old = out.get(key)
                if old is not None and level_severity(old.level) >= level_severity(level):
                    continue
                out[key] = RankFault(
                    r.rank,
                    node,
                    r.device_id,
                    pod_rank,
                    f.code,
                    level,
                    fault_type(job, f.code),
                    f.first_seen_ms,
                )
    return [out[k] for k in sorted(out)]


def job_health(faults: Iterable[RankFault]) -> str:
    """Job health from its rank faults (§6.4): UnHealthy / SubHealthy / Healthy."""
    health = HEALTHY
    for f in faults:
        if f.level not in NOT_UNHEALTHY_LEVELS:
            return UNHEALTHY
        if f.level != "NotHandleFault":
            health = SUB_HEALTHY
    return health


def node_fault_infos(
    nodes: Iterable[str],
    faults_of_node: Callable[[str], Iterable[Fault]],
    node_info: Callable[[str], dict],
    device_filter: Callable[[str, Fault], bool] = lambda node, f: True,
) -> list[dict]:
    """The ``nodeFaultInfo`` list of a FaultMsgSignal (clusterd.md §2.4), as dicts.

    NotHandleFault is left out. Devices are grouped by (deviceId, deviceType), sorted by id then
    type; duplicate codes are merged keeping the most severe level; ``deviceId`` is "-1" for node
    and switch faults. faultLevel = Healthy / SubHealthy / UnHealthy; the node level is the worst
    of its devices. Nodes without faults are left out.
    """
    out = []
    for node in nodes:
        devices: dict[tuple[int, str], dict[str, str]] = {}
        for f in faults_of_node(node):
            if f.level in ("NotHandleFault", "NotHandle") or not device_filter(node, f):
                continue
            dev_id = -1 if f.device_id < 0 or f.device_type in ("Node", "Switch") else f.device_id
            codes = devices.setdefault((dev_id, f.device_type), {})
            old = codes.get(f.code)
            if old is None or level_severity(f.level) > level_severity(old):
                codes[f.code] = f.level
        if not devices:
            continue
        info = node_info(node)
        devs = []
        worst = HEALTHY
        for (dev_id, dtype), codes in sorted(devices.items()):
            healths = [level_health(lv) for lv in codes.values()]
            h = UNHEALTHY if UNHEALTHY in healths else SUB_HEALTHY if SUB_HEALTHY in healths else HEALTHY
            if h == UNHEALTHY or (h == SUB_HEALTHY and worst == HEALTHY):
                worst = h
            devs.append(
                {
                    "deviceId": str(dev_id),
                    "deviceType": dtype,
                    "faultCodes": sorted(codes),
                    "faultLevel": h,
                    "faultLevels": [codes[c] for c in sorted(codes)],
                }
            )
        out.append(
            {
                "nodeName": node,
                "nodeIP": info.get("node_ip", ""),
                "nodeSN": info.get("node_sn", ""),
                "faultLevel": worst,
                "faultDevice": devs,
            }
        )
    return out
