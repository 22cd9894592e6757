"""MindIE's global rank table (``config.Config/SubscribeRankTable``; clusterd.md §2.6).

The reference (component/clusterd/pkg/domain/epranktable/ranktable_manager.go
``GeneratePdDeployModeRankTable`` and ranktable_util.go) builds it for a MindIE multi-instance
service, the set of jobs that carry the label ``jobID=<MindIE job id>`` and an ``app`` role:

- the server instances (``mindie-ms-server``): each one's HCCL rank table (its ``rings-config-*``
  ConfigMap, status ``completed``, label ``grt-server/deploy-server`` or ``grt-group/deploy-server``);
- the coordinator (``mindie-ms-coordinator``) and the controller (``mindie-ms-controller``): their pods'
  host IP (``server_id``) and pod IP (``server_ip``).

Shape (``PdDeployModeRankTable``, Go field order)::

    {"version": "1.0", "status": "completed", "server_group_list": [
      {"group_id": "0", "server_count": "1", "server_list": [{"server_id": host IP, "server_ip": pod IP}]},
      {"group_id": "1", ...controller...},
      # single node (every server instance has one pod): one group of every instance's first server
      {"group_id": "2", "server_count": "<instances>", "server_list": [
        {"device": [{"device_id", "device_ip", "device_logical_id", "rank_id"}], "deploy_server",
         "server_id", "server_ip"?}]},
      # cross node (an instance with more pods): one group per instance, ids 2, 3, ...
      {"group_id": "2", "deploy_server", "server_count", "server_list": [...], "super_pod_list"?}]}

faultmesh builds the server tables from the registry's jobs (their ranks; ``server_id`` = the
pod's ``hostIp`` on that node, else the IP its agents report; ``server_ip`` = the pod's ``podIp`` when known;
``deploy_server`` = the job's ``deployServer``, else its number of servers). Not ready (the reference
retries) while: no server job, no server job with ranks, no coordinator or controller job, one of
their pods without a host or pod IP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faultmesh.jobspec import Job

SERVER = "mindie-ms-server"
COORDINATOR = "mindie-ms-coordinator"
CONTROLLER = "mindie-ms-controller"
APPS = (SERVER, COORDINATOR, CONTROLLER)
VERSION = "1.0"
COMPLETED = "completed"


class NotReady(Exception):
    """The global rank table cannot be built yet (the message says why, as the reference logs it)."""


def host_ip(job: Job, node: str, node_ip: Callable[[str], str]) -> str:
    """The host IP of ``job``'s server on ``node``: its pod's ``hostIp`` where the job declares one (the
    reference reads it from the pod), else the IP the node's agents report (``node_ip``), else ""."""
    pod = next((p for p in job.pods if p.node == node), None)
    return (pod.host_ip if pod is not None else "") or node_ip(node)


def _pod_ip(job: Job, node: str) -> str:
    pod = next((p for p in job.pods if p.node == node), None)
    return pod.pod_ip if pod else ""


def _server(job: Job, node: str, node_ip: Callable[[str], str]) -> dict[str, Any]:
    """One server of an instance's rank table (``Server``), devices with their logical ids."""
    devices = [
        {
            "device_id": str(r.device_id),
            "device_ip": r.device_ip,
            "device_logical_id": str(i),
            "rank_id": str(r.rank),
        }
        for i, r in enumerate(job.ranks_on(node))
    ]
    out: dict[str, Any] = {"device": devices, "server_id": host_ip(job, node, node_ip) or node}
    if pod_ip := _pod_ip(job, node):
        out["server_ip"] = pod_ip
    return out


def _super_pods(job: Job, node_ip: Callable[[str], str]) -> list[dict[str, Any]]:
    by_pod: dict[int, list[str]] = {}
    for node in job.nodes():
        spids = {r.super_pod_id for r in job.ranks_on(node) if r.super_pod_id >= 0}
        for spid in spids:
            by_pod.setdefault(spid, []).append(host_ip(job, node, node_ip) or node)
    return [
        {"super_pod_id": str(spid), "server_list": [{"server_id": s} for s in servers]}
        for spid, servers in sorted(by_pod.items())
    ]


def _ip_group(group_id: str, job: Job | None, what: str, node_ip: Callable[[str], str]) -> dict[str, Any]:
    """Group 0 (coordinator) or 1 (controller): the pods' host and pod IPs (GenerateServerGroup0Or1)."""
    if job is None:
        raise NotReady(f"no {what} job found")
    pods = [(p.node, p.pod_ip) for p in job.pods] or [(n, "") for n in job.nodes()]
    if not pods:
        raise NotReady(f"{what} server pod num is 0")
    servers = []
    for node, pod_ip in pods:
        host = host_ip(job, node, node_ip)
        if not host or not pod_ip:
            raise NotReady(f"{what} server pod is not scheduled")
        servers.append({"server_id": host, "server_ip": pod_ip})
    return {"group_id": group_id, "server_count": str(len(servers)), "server_list": servers}


def members(jobs: list[Job], mindie_id: str) -> list[Job]:
    """The jobs of MindIE service ``mindie_id`` (label jobID), by namespace, name."""
    return [j for j in jobs if j.mindie_job_id == mindie_id and mindie_id]


def global_rank_table(jobs: list[Job], mindie_id: str, node_ip: Callable[[str], str]) -> dict[str, Any]:
    """The global rank table of MindIE service ``mindie_id`` from ``jobs`` (the registry's);
    ``node_ip(node)`` -> the node's IP or "". Raises :class:`NotReady` (module docstring)."""
    mine = members(jobs, mindie_id)
    servers = [j for j in mine if j.app == SERVER]
    if not servers:
        raise NotReady(f"no jobId ({mindie_id}) server job")
    ns = servers[0].namespace  # the reference resolves the namespace from the first server job
    servers = [j for j in servers if j.namespace == ns]
    pick = lambda app: next((j for j in mine if j.app == app and j.namespace == ns), None)  # noqa: E731
    tables = [j for j in servers if j.ranks]
    if not tables:
        raise NotReady("no completed a2 rank table")
    group0 = _ip_group("0", pick(COORDINATOR), COORDINATOR, node_ip)
    group1 = _ip_group("1", pick(CONTROLLER), CONTROLLER, node_ip)
    cross = any(len(j.nodes()) > 1 for j in servers)  # GetPdDeploymentMode: a server job with replicas > 1
    groups = [group0, group1]
    if not cross:
        group2 = []
        for j in tables:
            first = _server(j, j.nodes()[0], node_ip)
            group2.append(
                {"device": first["device"], "deploy_server": j.deploy_server or "1", **_rest(first)}
            )
        groups.append({"group_id": "2", "server_count": str(len(tables)), "server_list": group2})
    else:
        for i, j in enumerate(tables):
            group: dict[str, Any] = {
                "group_id": str(i + 2),
                "deploy_server": j.deploy_server or str(len(j.nodes())),
                "server_count": str(len(j.nodes())),
                "server_list": [_server(j, n, node_ip) for n in j.nodes()],
            }
            if sp := _super_pods(j, node_ip):
                group["super_pod_list"] = sp
            groups.append(group)
    return {"version": VERSION, "status": COMPLETED, "server_group_list": groups}


def _rest(server: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in server.items() if k != "device"}
