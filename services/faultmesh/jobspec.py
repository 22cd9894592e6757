"""Job files: the format and parsing of training jobs, their ranks and their recovery settings.

Core (issue 12): the CLI (``faultmesh job apply``) and ClusterD's job registry
(:mod:`clusterd.brain.jobs`) both parse with this module. Source: issue 7 "Jobs"; clusterd.md §7.1 (the PodGroup labels and annotations a job carries) and
§6.4 (fault -> rank mapping). Without Kubernetes a job comes from ``faultmesh job apply`` (HTTP
``POST /v1/jobs``); the Recover Init/Register flow then marks it for process-level recovery.

A job spec (JSON or YAML; one object, a list, or ``{"jobs": [...]}``)::

    id: 7f3c0d5e-job-uid          # the job's UID ("jobId" on every upstream RPC); also jobId / uid
    name: llama                   # required
    namespace: default
    status: running               # pending | running | completed | failed
    framework: pytorch            # pytorch | mindspore | tensorflow
    recover-strategy: retry,recover,dump      # annotation (list or comma string)
    process-recover-enable: "on"  # label: on | pause | "" (off)
    fault-scheduling: grace       # label: grace | force | ""
    pod-rescheduling: "on"        # label
    subHealthyStrategy: hotSwitch # label: ignore | graceExit | hotSwitch
    backupNodes: [node-c]         # standalone: spare nodes a hot switch may move a pod to
    wait-reschedule-timeout: 270  # annotation: wait for the fault pods to be rescheduled (30..270 s)
    mindioWaitMindxTime: 60       # the rank-0 pod's MINDIO_WAIT_MINDX_TIME (1..3600 s; 0 = unset)
    huawei.com/schedule.filter.faultCode: "8C1F8608:30,80E01801"   # annotations: faults hidden for a
    huawei.com/schedule.filter.faultLevel: "RestartRequest:30"      # while (faultmesh.faultfilter)
    ranks:                        # global rank -> (node, device id); one pod per node
      - {rank: 0, node: node-a, device: 0, superPodId: 0, deviceIp: 10.20.0.1}
    # MindIE multi-instance services (clusterd.md §2.6; the reference's pod labels jobID / app):
    jobID: mindie-svc-1           # the MindIE job id a config.Config client subscribes with
    app: mindie-ms-server         # mindie-ms-server | mindie-ms-coordinator | mindie-ms-controller
    deployServer: "2"             # the rank table's grt-server/deploy-server (or grt-group/...) label
    pods:                         # the job's pods with their IPs (coordinator / controller have no ranks)
      - {node: node-a, podIp: 172.16.0.5, hostIp: 10.0.0.1}

Ranks are grouped into pods by node (pod rank = order of the node's lowest rank), as the
reference groups them by ``rank / NPUs-per-pod``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from faultmesh import faultfilter
from faultmesh.config import YamlTooLarge, load_yaml

# clusterd.md §7.1: kept strategy values and their priority.
STRATEGY_PRIORITY = {
    "retry": 1,
    "recover-in-place": 2,
    "recover": 3,
    "elastic-training": 4,
    "dump": 5,
    "exit": 6,
}
SUBHEALTH_STRATEGIES = ("ignore", "graceExit", "hotSwitch")
STATUSES = ("pending", "running", "completed", "failed")
FRAMEWORKS = ("pytorch", "mindspore", "tensorflow", "")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9\-.]{0,251}[a-z0-9])?$")
ID_RE = re.compile(r"^[A-Za-z0-9\-_.]{1,128}$")
MAX_RANKS = 100_000


class JobSpecError(ValueError):
    """A job spec that cannot be applied (the message names the field and why)."""


@dataclass(frozen=True, slots=True)
class Rank:
    """One global rank placed on ``node``'s NPU ``device_id`` (``super_pod_id`` -1 = none known;
    ``device_ip`` the NPU's RoCE IP, "" unknown)."""

    rank: int
    node: str
    device_id: int
    super_pod_id: int = -1
    device_ip: str = ""


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod of a job on ``node`` with its pod IP and (when known) its host IP."""

    node: str
    pod_ip: str
    host_ip: str = ""


INT32_MAX = 2**31 - 1  # rank, device and super-pod ids travel as int32 (RankPlacement, JobInfo)


@dataclass(frozen=True, slots=True)
class _Placement:
    """A job's placement index: ``nodes`` in pod-rank order, node -> ``pod_rank``, node -> ranks
    (``by_node``, by rank), (node, device id) -> rank (``by_device``), rank -> node."""

    nodes: list[str]
    pod_rank: dict[str, int]
    by_node: dict[str, list[Rank]]
    by_device: dict[tuple[str, int], Rank]
    node_of_rank: dict[int, str]


@dataclass(frozen=True, slots=True)
class Job:
    """A training job (fields as in the module docstring; times in ms since the epoch)."""

    id: str
    name: str
    namespace: str = "default"
    status: str = "running"
    framework: str = "pytorch"
    recover_strategy: tuple[str, ...] = ()
    process_recover_enable: str = ""
    fault_scheduling: str = ""
    pod_rescheduling: str = ""
    sub_healthy_strategy: str = ""
    backup_nodes: tuple[str, ...] = ()
    ranks: tuple[Rank, ...] = ()
    mindie_job_id: str = ""
    app: str = ""
    deploy_server: str = ""
    pods: tuple[Pod, ...] = ()
    wait_reschedule_s: int = 270
    mindio_wait_s: int = 0
    filter_fault_code: str = ""  # the job's fault filter annotations, as faultfilter.clean writes them
    filter_fault_level: str = ""
    created_ms: int = 0
    updated_ms: int = 0
    # PodGroup-only settings (clusterd.kube.podgroups: wait-reschedule-timeout, fault-retry-times).
    # Compared (a change of only these re-applies the job), not hashed (a dict).
    extra: dict[str, str] = field(default_factory=dict, hash=False)
    # the placement index (:meth:`_placement`), built on first use: derived, never compared or stored
    _index: _Placement | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    def _placement(self) -> _Placement:
        """Nodes in pod-rank order and ranks by node, (node, device) and rank: one pass over the
        ranks for the job's life (a 20k-rank job's per-node views were O(nodes x ranks))."""
        idx = self._index
        if idx is None:
            by_node: dict[str, list[Rank]] = {}
            for r in sorted(self.ranks, key=lambda r: r.rank):
                by_node.setdefault(r.node, []).append(r)
            order = sorted(by_node, key=lambda n: (by_node[n][0].rank, n))
            idx = _Placement(
                order,
                {n: i for i, n in enumerate(order)},
                by_node,
                {(r.node, r.device_id): r for r in self.ranks},
                {r.rank: r.node for r in self.ranks},
            )
            object.__setattr__(self, "_index", idx)
        return idx

    # -- derived views ---------------------------------------------------------------------------
    @property
    def ns_name(self) -> str:
        """``namespace/name`` (the data-trace key)."""
        return f"{self.namespace}/{self.name}"

    def strategies(self) -> list[str]:
        """The effective strategy list of clusterd.md §7.1: kept values + exit, by priority."""
        kept = {s for s in self.recover_strategy if s in STRATEGY_PRIORITY}
        kept.add("exit")
        return sorted(kept, key=STRATEGY_PRIORITY.__getitem__)

    def rescheduling(self) -> list[str]:
        """``job-rescheduling`` / ``pod-rescheduling`` entries derived from the labels (§7.1)."""
        out = []
        if self.fault_scheduling in ("grace", "force"):
            out.append("job-rescheduling")
        if self.pod_rescheduling == "on":
            out.append("pod-rescheduling")
        return out

    def nodes(self) -> list[str]:
        """The job's nodes (its pods' servers) in pod-rank order."""
        return list(self._placement().nodes)

    def pod_rank(self, node: str) -> int:
        """Pod rank of the pod on ``node`` (-1 when the job has no rank there)."""
        return self._placement().pod_rank.get(node, -1)

    def rank_of(self, node: str, device_id: int) -> Rank | None:
        """The rank placed on (node, device_id), or None."""
        return self._placement().by_device.get((node, device_id))

    def ranks_on(self, node: str) -> list[Rank]:
        """Ranks hosted by ``node``, by rank."""
        return list(self._placement().by_node.get(node, ()))

    def node_of_rank(self, rank: int) -> str | None:
        """The node hosting global rank ``rank``."""
        return self._placement().node_of_rank.get(rank)

    def rank_table(self) -> dict[str, Any]:
        """The job's HCCL rank table (``hccl.json`` shape): servers with device_id / rank_id strings."""
        servers = []
        for node in self.nodes():
            servers.append(
                {
                    "server_id": node,
                    "device": [
                        {"device_id": str(r.device_id), "rank_id": str(r.rank)} for r in self.ranks_on(node)
                    ],
                }
            )
        return {
            "status": "completed",
            "version": "1.0",
            "server_count": str(len(servers)),
            "server_list": servers,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the same keys ``job apply`` accepts)."""
        return {
            "id": self.id,
            "name": self.name,
            "namespace": self.namespace,
            "status": self.status,
            "framework": self.framework,
            "recover-strategy": list(self.recover_strategy),
            "process-recover-enable": self.process_recover_enable,
            "fault-scheduling": self.fault_scheduling,
            "pod-rescheduling": self.pod_rescheduling,
            "subHealthyStrategy": self.sub_healthy_strategy,
            "backupNodes": list(self.backup_nodes),
            "wait-reschedule-timeout": self.wait_reschedule_s,
            "mindioWaitMindxTime": self.mindio_wait_s,
            **({faultfilter.CODE_KEY: self.filter_fault_code} if self.filter_fault_code else {}),
            **({faultfilter.LEVEL_KEY: self.filter_fault_level} if self.filter_fault_level else {}),
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node,
                    "device": r.device_id,
                    "superPodId": r.super_pod_id,
                    **({"deviceIp": r.device_ip} if r.device_ip else {}),
                }
                for r in self.ranks
            ],
            **({"jobID": self.mindie_job_id} if self.mindie_job_id else {}),
            **({"app": self.app} if self.app else {}),
            **({"deployServer": self.deploy_server} if self.deploy_server else {}),
            **(
                {
                    "pods": [
                        {"node": p.node, "podIp": p.pod_ip, **({"hostIp": p.host_ip} if p.host_ip else {})}
                        for p in self.pods
                    ]
                }
                if self.pods
                else {}
            ),
            **({"extra": dict(self.extra)} if self.extra else {}),
            "created_ms": self.created_ms,
            "updated_ms": self.updated_ms,
        }


def _pick(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


def _str(d: dict[str, Any], names: tuple[str, ...], default: str = "") -> str:
    v = _pick(d, *names, default=default)
    if isinstance(v, bool):  # YAML 1.1 turns a bare on into True
        return "on" if v else ""
    if not isinstance(v, (str, int)):
        raise JobSpecError(f"{names[0]} must be a string")
    return str(v)


def _whole(v: Any) -> int:
    """An integer from a YAML/JSON value: an int, a whole float or a decimal string. Raises
    ``ValueError`` for a boolean (``true`` is no rank 1) or a fraction, ``TypeError`` for None."""
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(v)
    return int(v)


def _int(d: dict[str, Any], names: tuple[str, ...], default: int, lo: int, hi: int) -> int:
    v = _pick(d, *names, default=default)
    try:
        n = _whole(v)
    except (TypeError, ValueError):
        raise JobSpecError(f"{names[0]} must be an integer ({lo}..{hi})") from None
    if not lo <= n <= hi:
        raise JobSpecError(f"{names[0]} must be in {lo}..{hi}, got {n}")
    return n


def parse_job(d: Any) -> Job:
    """Validate one job spec (module docstring) and return a :class:`Job`. Raises :class:`JobSpecError`."""
    if not isinstance(d, dict):
        raise JobSpecError("a job must be an object")
    job_id = _str(d, ("id", "jobId", "uid", "job_id"))
    if not ID_RE.match(job_id):
        raise JobSpecError(f"id {job_id[:140]!r} must match {ID_RE.pattern}")
    name = _str(d, ("name", "jobName"))
    if not NAME_RE.match(name):
        raise JobSpecError(f"name {name[:64]!r} must be a DNS-1123 name")
    namespace = _str(d, ("namespace",), "default")
    if not NAME_RE.match(namespace) or len(namespace) > 63:
        raise JobSpecError(f"namespace {namespace[:64]!r} must be a DNS-1123 label")
    status = _str(d, ("status",), "running").lower()
    if status not in STATUSES:
        raise JobSpecError(f"status {status!r} must be one of {', '.join(STATUSES)}")
    framework = _str(d, ("framework", "frameWork"), "pytorch").lower()
    if framework not in FRAMEWORKS:
        raise JobSpecError(f"framework {framework!r} must be one of pytorch, mindspore, tensorflow")
    rs = _pick(d, "recover-strategy", "recoverStrategy", "recover_strategy", default=[])
    if isinstance(rs, str):
        rs = [s.strip() for s in rs.split(",") if s.strip()]
    if not isinstance(rs, list) or not all(isinstance(s, str) for s in rs):
        raise JobSpecError("recover-strategy must be a list or a comma-separated string")
    bad = [s for s in rs if s not in STRATEGY_PRIORITY]
    if bad:
        raise JobSpecError(
            f"recover-strategy has unknown values {bad}; known: {', '.join(STRATEGY_PRIORITY)}"
        )
    pre = _str(d, ("process-recover-enable", "processRecoverEnable"), "")
    if pre not in ("on", "pause", "off", ""):
        raise JobSpecError("process-recover-enable must be on, pause, off or empty")
    fs = _str(d, ("fault-scheduling", "faultScheduling"), "")
    if fs not in ("grace", "force", "off", ""):
        raise JobSpecError("fault-scheduling must be grace, force, off or empty")
    pr = _str(d, ("pod-rescheduling", "podRescheduling"), "")
    if pr not in ("on", "off", ""):
        raise JobSpecError("pod-rescheduling must be on, off or empty")
    shs = _str(d, ("subHealthyStrategy", "sub-healthy-strategy", "subhealthy-strategy"), "")
    if shs and shs not in SUBHEALTH_STRATEGIES:
        raise JobSpecError(f"subHealthyStrategy {shs!r} must be one of {', '.join(SUBHEALTH_STRATEGIES)}")
    backups = _pick(d, "backupNodes", "backup-nodes", default=[])
    if not isinstance(backups, list) or not all(isinstance(n, str) and NAME_RE.match(n) for n in backups):
        raise JobSpecError("backupNodes must be a list of node names")
    wait_resched = _int(d, ("wait-reschedule-timeout", "waitRescheduleTimeout"), 270, 30, 270)
    mindio_wait = _int(d, ("mindioWaitMindxTime", "MINDIO_WAIT_MINDX_TIME"), 0, 0, 3600)
    filters = []
    for key, alias, kind in (
        (faultfilter.CODE_KEY, "filterFaultCode", "code"),
        (faultfilter.LEVEL_KEY, "filterFaultLevel", "level"),
    ):
        raw_filter = _str(d, (key, alias), "")
        if len(raw_filter) > 4096:
            raise JobSpecError(f"{key} is longer than 4096 characters")
        text, problems = faultfilter.clean(raw_filter, kind)
        if problems:
            raise JobSpecError(f"{key}: {'; '.join(problems)}")
        filters.append(text)
    raw = _pick(d, "ranks", default=[])
    if not isinstance(raw, list):
        raise JobSpecError("ranks must be a list")
    if len(raw) > MAX_RANKS:
        raise JobSpecError(f"ranks: at most {MAX_RANKS}")
    ranks: list[Rank] = []
    seen_rank: set[int] = set()
    seen_dev: set[tuple[str, int]] = set()
    for i, r in enumerate(raw):
        if not isinstance(r, dict):
            raise JobSpecError(f"ranks[{i}] must be an object with rank, node, device")
        try:
            rank = _whole(_pick(r, "rank", "rankId", "rank_id"))
            dev = _whole(_pick(r, "device", "deviceId", "device_id"))
            spid = _whole(_pick(r, "superPodId", "super_pod_id", default=-1))
        except (TypeError, ValueError):
            raise JobSpecError(f"ranks[{i}]: rank, device and superPodId must be integers") from None
        node = _pick(r, "node", "nodeName")
        if not isinstance(node, str) or not NAME_RE.match(node):
            raise JobSpecError(f"ranks[{i}]: node must be a node name")
        if not (0 <= rank <= INT32_MAX and 0 <= dev <= INT32_MAX and -1 <= spid <= INT32_MAX):
            raise JobSpecError(
                f"ranks[{i}]: rank and device must be in 0..{INT32_MAX}, superPodId in -1..{INT32_MAX}"
            )
        if rank in seen_rank:
            raise JobSpecError(f"ranks[{i}]: rank {rank} appears twice")
        if (node, dev) in seen_dev:
            raise JobSpecError(f"ranks[{i}]: device {node}/{dev} holds two ranks")
        seen_rank.add(rank)
        seen_dev.add((node, dev))
        ranks.append(Rank(rank, node, dev, spid, _ip(r, ("deviceIp", "device_ip"), f"ranks[{i}]")))
    ranks.sort(key=lambda r: r.rank)
    mindie_id = _str(d, ("jobID", "mindieJobId", "mindie-job-id"), "")
    app = _str(d, ("app",), "")
    deploy = _str(d, ("deployServer", "deploy-server"), "")
    if len(mindie_id) > 128 or len(app) > 63 or len(deploy) > 63:
        raise JobSpecError("jobID (at most 128), app and deployServer (at most 63) are too long")
    raw_pods = _pick(d, "pods", default=[])
    if not isinstance(raw_pods, list) or len(raw_pods) > MAX_RANKS:
        raise JobSpecError(f"pods must be a list of at most {MAX_RANKS}")
    pods = []
    for i, p in enumerate(raw_pods):
        node = p.get("node", p.get("nodeName")) if isinstance(p, dict) else None
        if not isinstance(node, str) or not NAME_RE.match(node):
            raise JobSpecError(f"pods[{i}] must be an object with node and podIp")
        pods.append(
            Pod(node, _ip(p, ("podIp", "pod_ip"), f"pods[{i}]"), _ip(p, ("hostIp", "host_ip"), f"pods[{i}]"))
        )
    return Job(
        id=job_id,
        name=name,
        namespace=namespace,
        status=status,
        framework=framework,
        recover_strategy=tuple(dict.fromkeys(rs)),
        process_recover_enable="" if pre == "off" else pre,
        fault_scheduling="" if fs == "off" else fs,
        pod_rescheduling="" if pr == "off" else pr,
        sub_healthy_strategy=shs,
        backup_nodes=tuple(backups),
        ranks=tuple(ranks),
        mindie_job_id=mindie_id,
        app=app,
        deploy_server=deploy,
        pods=tuple(pods),
        wait_reschedule_s=wait_resched,
        mindio_wait_s=mindio_wait,
        filter_fault_code=filters[0],
        filter_fault_level=filters[1],
    )


def _ip(d: dict[str, Any], names: tuple[str, ...], where: str) -> str:
    """An optional IP address field ("" when absent). Raises :class:`JobSpecError`."""
    v = _pick(d, *names, default="")
    if v == "":
        return ""
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise JobSpecError(f"{where}: {names[0]} {str(v)[:64]!r} is not an IP address") from None


def parse_jobs_text(text: str, max_yaml_bytes: int | None = None) -> list[Job]:
    """Parse a JSON or YAML document (one job, a list, ``{"jobs": [...]}`` or several YAML documents).

    JSON is read by orjson (a 20k-rank job file: milliseconds, where PyYAML takes seconds); other
    text by PyYAML (:func:`faultmesh.config.load_yaml`), refused over ``max_yaml_bytes`` (network
    input: ``config.MAX_YAML_BYTES``). Raises :class:`JobSpecError` naming the job index and the
    problem.
    """
    try:
        docs = [d for d in (orjson.loads(text),) if d is not None]
    except (orjson.JSONDecodeError, TypeError):
        try:
            docs = [d for d in load_yaml(text, many=True, max_bytes=max_yaml_bytes) if d is not None]
        except YamlTooLarge as e:
            raise JobSpecError(str(e)) from None
        except ValueError as e:
            raise JobSpecError(f"not JSON or YAML: {str(e).removeprefix('not YAML/JSON: ')}") from None
    items: list[Any] = []
    for d in docs:
        if isinstance(d, dict) and "jobs" in d:
            d = d["jobs"]
        items.extend(d if isinstance(d, list) else [d])
    return parse_jobs(items)


def parse_jobs(items: Iterable[Any]) -> list[Job]:
    """Validate a list of job specs; ids must be unique. Raises :class:`JobSpecError`."""
    out: list[Job] = []
    ids: set[str] = set()
    for i, d in enumerate(items):
        try:
            job = parse_job(d)
        except JobSpecError as e:
            raise JobSpecError(f"job {i}: {e}") from None
        if job.id in ids:
            raise JobSpecError(f"job {i}: id {job.id} appears twice")
        ids.add(job.id)
        out.append(job)
    if not out:
        raise JobSpecError("no job in the document")
    return out


def job_from_store(d: dict[str, Any]) -> Job:
    """Rebuild a stored job (its :meth:`Job.to_dict`) keeping its times and its ``extra`` (the
    PodGroup-only settings, so that a restarted clusterd's first Kubernetes sync finds the job
    unchanged). Raises :class:`JobSpecError`."""
    job = parse_job(d)
    extra = d.get("extra") or {}
    if not isinstance(extra, dict):
        raise JobSpecError("extra must be an object")
    return replace(
        job,
        created_ms=int(d.get("created_ms", 0)),
        updated_ms=int(d.get("updated_ms", 0)),
        extra={str(k): str(v) for k, v in extra.items()},
    )
