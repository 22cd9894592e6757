"""FD-OL slow-node detection, node part, inside noded (issue 5; reference fdol.md §2–4).

Control messages from ClusterD:

- ``slownode_job`` (``SlowNodeJob``): ``enable`` starts or updates detection of a job for the job's
  global ranks hosted on this node (``ranks``) with its FeatConf (``featconf_json``); ``enable=false``
  stops it. A bad FeatConf is rejected (the ack carries the reason).
- ``data_trace`` (``DataTraceSwitch``): with ``--slownode-data-trace-dir`` the switch is written to
  ``<dir>/<ns>.data-trace-<job>/profilingSwitch`` (the device-plugin's job: the file training
  containers mount); otherwise it is only recorded.

Per job, every ``nSecondsDoOneDetection`` seconds, in the blocking pool (file I/O and parsing never
run on the event loop): tail ``<--profiling-dir>/<job id>/<rank>/`` of each local rank
(:class:`~fdol.slownode.reader.JobReader`), turn records into per-step metrics, run one node round
(:class:`~fdol.slownode.node.NodeDetector`). A result (there is none when no new step arrived) goes
to ClusterD through ``ctx.state.add_slownode_report`` as ``{"slownode_<jobId>": {"<nodeIp>": result}}``;
a slow one also logs ``[FD-OL SLOWNODE]job(name=<job>, namespace=<ns>, jobId=<id>) detected node:
<nodeIp> is degradation, slow rank ids: [3]``. ``nodeIp`` is ``--node-ip`` (env ``NODE_IP``, else
``XDL_IP``, as the reference's) or the node name.

``GET /v1/slownode`` on noded's HTTP server (a route of the source's context) lists the jobs with their latest node result and the
bad-input counters per reason.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
from prometheus_client import Counter

from faultmesh._pb import agent_pb2
from faultmesh.files import atomic_write
from faultmesh.httplite import Request, Response, json_response
from faultmesh.log import event
from faultmesh.model import now_ms
from faultmesh.source import PushSource, SourceContext
from fdol.slownode.featconf import FeatConf, parse_featconf
from fdol.slownode.switch import SWITCH_FILE, switch_dir_name
from noded.sections import SlowNodeConfig

if TYPE_CHECKING:  # imported by the first job (_on_job): a noded that runs none never loads them
    from fdol.slownode.metrics import StepAssembler
    from fdol.slownode.node import NodeDetector
    from fdol.slownode.reader import JobReader

log = logging.getLogger("noded.slownode")


def prefix(conf: FeatConf) -> str:
    """``[FD-OL SLOWNODE]job(name=<job>, namespace=<ns>, jobId=<id>)``."""
    return f"[FD-OL SLOWNODE]job(name={conf.job_name}, namespace={conf.job_namespace}, jobId={conf.job_id})"


@dataclass
class NodeJob:
    """One job's node part: reader, per-rank assemblers, detector, loop task, latest result."""

    conf: FeatConf
    ranks: list[int]
    reader: JobReader
    assemblers: dict[int, StepAssembler]
    detector: NodeDetector
    task: asyncio.Task | None = None
    latest: dict | None = None
    reported_bad: dict[str, int] = field(default_factory=dict)
    started_ms: int = 0


class SlowNode(PushSource):
    """The slow-node source (module doc): fed by control messages, one detection loop per job.
    Build with :meth:`from_config`, then ``await start(ctx)``."""

    name = "slownode"
    Config = SlowNodeConfig  # its section (noded.sources.config_section)
    control_kinds = ("slownode_job", "data_trace")

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Flags ``--profiling-dir``, ``--slownode-data-trace-dir``, ``--slownode-round-timeout``."""
        g = parser.add_argument_group("slownode (FD-OL node part)")
        g.add_argument(
            "--profiling-dir",
            default="/user/cluster-info/profiling",
            help="lightweight-profiling root: <dir>/<job id>/<rank>/",
        )
        g.add_argument(
            "--slownode-data-trace-dir",
            default="",
            help="write data-trace switch files here (<ns>.data-trace-<job>/profilingSwitch)",
        )
        g.add_argument(
            "--slownode-round-timeout",
            type=float,
            default=60.0,
            help="limit of one detection round in the blocking pool (s)",
        )

    @classmethod
    def from_config(cls, cfg: SlowNodeConfig, metrics=None) -> SlowNode:
        """The source for its flag section ``cfg`` (``metrics``: unused, its own are on ctx.registry)."""
        return cls(cfg)

    def __init__(self, config: SlowNodeConfig) -> None:
        super().__init__()
        self.config = config
        self.node_ip = ""
        self.jobs: dict[str, NodeJob] = {}
        self.switches: dict[str, dict[str, str]] = {}

    async def start(self, ctx: SourceContext) -> None:
        """Take the context: metrics, route ``GET /v1/slownode``, control kinds ``slownode_job`` /
        ``data_trace``. Jobs start on control messages."""
        await super().start(ctx)
        self.node_ip = ctx.node_ip or ctx.node  # FD-OL's nodeIp: --node-ip (env NODE_IP, XDL_IP)
        self.m_bad = Counter(
            "faultmesh_slownode_bad_input_total",
            "Rejected profiling input by reason",
            ["reason"],
            registry=ctx.registry,
        )
        self.m_rounds = Counter(
            "faultmesh_slownode_node_rounds_total",
            "Node detection rounds with a result",
            ["slow"],
            registry=ctx.registry,
        )
        self.m_steps = Counter(
            "faultmesh_slownode_steps_total", "Per-step metrics computed", registry=ctx.registry
        )
        ctx.add_route("GET", "/v1/slownode", self._http_list)
        for kind in self.control_kinds:
            ctx.on_control(kind, self.on_control)

    async def stop(self) -> None:
        """Stop every job's detection (their loops are cancelled with the context's tasks)."""
        for job_id in list(self.jobs):
            self._stop(job_id, "noded stopping")
        await super().stop()

    # -- control ----------------------------------------------------------------------------------
    async def on_control(self, msg: agent_pb2.ControlMessage) -> None:
        """Handle ``slownode_job`` / ``data_trace``. Raises ``ValueError`` on a bad message."""
        kind = msg.WhichOneof("body")
        if kind == "slownode_job":
            await self._on_job(msg.slownode_job)
        elif kind == "data_trace":
            await self._on_data_trace(msg.data_trace)

    async def _on_job(self, j: agent_pb2.SlowNodeJob) -> None:
        if not j.enable:
            self._stop(j.job_id, "disabled by clusterd")
            return
        try:
            obj = orjson.loads(j.featconf_json)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"featconf_json is not JSON: {e}") from None
        conf = parse_featconf(obj)
        if conf.job_id != j.job_id:
            raise ValueError(f"job id mismatch: message {j.job_id!r}, FeatConf {conf.job_id!r}")
        ranks = sorted(set(j.ranks))
        old = self.jobs.get(conf.job_id)
        if old is not None and old.conf == conf and old.ranks == ranks:
            return
        if old is not None:
            self._stop(conf.job_id, "updated")
        if conf.slow_node == 0 or not ranks:
            return
        from fdol.slownode.metrics import StepAssembler
        from fdol.slownode.node import NodeDetector
        from fdol.slownode.reader import JobReader

        job_dir = Path(self.config.profiling_dir) / conf.job_id
        reader = JobReader(job_dir, ranks, start_time_s=None)
        assemblers = {
            r: StepAssembler(r, lambda r=r: reader.groups(r), traffic=conf.traffic, bad=reader.bad)
            for r in ranks
        }
        nj = NodeJob(
            conf,
            ranks,
            reader,
            assemblers,
            NodeDetector(conf, ranks, self.node_ip, reader.bad),
            started_ms=now_ms(),
        )
        self.jobs[conf.job_id] = nj
        nj.task = self.ctx.spawn(self._loop(nj), name=f"slownode-{conf.job_id}")
        event(
            log,
            logging.INFO,
            f"{prefix(conf)} node slow node detection started",
            node=self.node_ip,
            ranks=",".join(map(str, ranks)),
            dir=str(job_dir),
            interval_s=conf.n_seconds,
        )

    def _stop(self, job_id: str, reason: str) -> None:
        nj = self.jobs.pop(job_id, None)
        if nj is None:
            return
        if nj.task is not None:
            nj.task.cancel()
        event(log, logging.INFO, f"{prefix(nj.conf)} node slow node detection stopped", reason=reason)

    async def _on_data_trace(self, d: agent_pb2.DataTraceSwitch) -> None:
        sw = {
            "CommunicationOperator": d.communication_operator,
            "Step": d.step,
            "SaveCheckpoint": d.save_checkpoint,
            "FP": d.fp,
            "DataLoader": d.data_loader,
        }
        ns, sep, name = d.job_ns_name.partition("/")
        if not sep or not ns or not name or "/" in name or ".." in d.job_ns_name:
            raise ValueError(f"job_ns_name must be namespace/jobName, got {d.job_ns_name!r}")
        self.switches[d.job_ns_name] = sw
        root = self.config.slownode_data_trace_dir
        if root:
            path = Path(root) / switch_dir_name(ns, name) / SWITCH_FILE
            await self.ctx.run_blocking(10.0, _write_switch, path, orjson.dumps(sw))
        event(log, logging.INFO, "data-trace switch received", job=d.job_ns_name, written=bool(root), **sw)

    # -- rounds -----------------------------------------------------------------------------------
    async def _loop(self, nj: NodeJob) -> None:
        interval = nj.conf.n_seconds
        next_t = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            next_t += interval
            if next_t < time.monotonic():
                next_t = time.monotonic() + interval
            try:
                res = await self.ctx.run_blocking(self.config.slownode_round_timeout, _round, nj)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failing round must not end detection
                event(log, logging.ERROR, "slownode node round failed", job=nj.conf.job_id, error=repr(e))
                continue
            self._count_bad(nj)
            if res is None:
                continue
            steps, result = res
            self.m_steps.inc(steps)
            if result is None:
                continue
            nj.latest = result
            slow = result["isSlow"] == 1
            self.m_rounds.labels(str(int(slow))).inc()
            if slow:
                ranks = " ".join(str(r) for r in result["slowCalculateRanks"])
                event(
                    log,
                    logging.INFO,
                    f"{prefix(nj.conf)} detected node: {self.node_ip} is degradation, slow rank ids: [{ranks}]",
                )
            body = {f"slownode_{nj.conf.job_id}": {self.node_ip: result}}
            self.ctx.state.add_slownode_report(
                agent_pb2.SlowNodeReport(
                    job_id=nj.conf.job_id,
                    node=self.ctx.node,
                    result_json=orjson.dumps(body),
                    timestamp_ms=now_ms(),
                )
            )

    def _count_bad(self, nj: NodeJob) -> None:
        for reason, n in nj.reader.bad.items():
            seen = nj.reported_bad.get(reason, 0)
            if n > seen:
                self.m_bad.labels(reason).inc(n - seen)
                nj.reported_bad[reason] = n
                if not seen:  # once per reason and job: the counter and /v1/slownode keep counting
                    event(
                        log, logging.WARNING, "slownode bad input", job=nj.conf.job_id, reason=reason, count=n
                    )

    async def _http_list(self, request: Request) -> Response:
        return json_response(
            [
                {
                    "jobId": nj.conf.job_id,
                    "jobName": nj.conf.job_name,
                    "namespace": nj.conf.job_namespace,
                    "ranks": nj.ranks,
                    "startedMs": nj.started_ms,
                    "latest": nj.latest,
                    "badInput": dict(nj.reader.bad),
                    "lastStep": nj.detector.last_detected_step,
                }
                for _, nj in sorted(self.jobs.items())
            ]
        )


def _round(nj: NodeJob) -> tuple[int, dict | None]:
    """Blocking part of one round: read new records, assemble steps, run the node round."""
    recs = nj.reader.poll()
    nj.detector.set_rank_groups({r: g for r in nj.ranks if (g := nj.reader.groups(r))})
    steps = 0
    for r, rs in recs.items():
        for m in nj.assemblers[r].feed(rs):
            nj.detector.add(m)
            steps += 1
    return steps, nj.detector.round()


def _write_switch(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
