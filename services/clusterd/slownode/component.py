"""FD-OL slow-node detection, cluster part, inside ClusterD (issue 5; reference fdol.md §3, §5–7):
the component, which owns the enabled jobs and composes the parts (:mod:`clusterd.slownode`).

Job control:

- HTTP ``POST /v1/slownode/jobs`` — enable or update a job: body = FeatConf (§7, keys
  case-insensitive) plus ``ranks: {"<global rank>": "<node>", ...}`` (the job's placement; optional
  when the brain's job registry knows the job). ``SlowNode: 0`` stops it. 400 with the reason on
  a bad FeatConf; bearer token when ClusterD has one.
- HTTP ``POST /v1/slownode/<job>/disable`` and ``DELETE /v1/slownode/<job>`` — stop a job.
- A watched directory (``--slownode-watch-dir``): files ``ras-feature-slownode-<job>.json`` holding
  the reference ConfigMap payload (a FeatConf object, ``{"FeatConf": "<json text>"}`` or
  ``{"data": {"FeatConf": ...}}``, optional ``ranks``). New/changed -> enable/update (or stop when
  ``SlowNode`` is 0); removed -> stop. Bad files are counted and logged once per version.
- Enabled jobs persist in the state file (store namespace ``slownode.jobs``) and resume on
  restart; noded instances hosting the job's ranks get a ``SlowNodeJob`` control message (again on
  every reconnect).

Detection: node results arrive through ``agents.on_slownode_report``; every
``nSecondsDoOneDetection`` the job's :class:`~fdol.slownode.cluster.ClusterDetector` merges those that
changed and :class:`~fdol.slownode.degradation.DegradationTracker` decides. Actions:
communication profiling on/off through the data-trace switch
(:class:`~clusterd.slownode.datatrace.DataTraceSwitch`) (initial phase on; first slow round on;
off after confirmation or when rounds are clean), after ``nConsecSlowRoundsToConfirm`` (5) slow rounds
the log line ``[FD-OL SLOWNODE]job(name=.., namespace=.., jobId=..) in cluster got degradation, slow
rank ids: [2]`` and fault 110001010 (SubHealthFault, source ``fd-online``, device_type ``Node``) on each
node hosting slow ranks (attribute ``influence`` = those global ranks); on recovery that fault is
removed and 100001011 (NotHandleFault, assertion once, removed after ``--slownode-once-ttl``) raised.
Deliberate differences: the fault is raised on the node hosting the slow ranks (the reference used
the host name of the FD-OL process); an update applies every FeatConf key and restarts the job's
detection state (the reference copied only SlowNode/Servers/RankIds on a modified ConfigMap, so
threshold changes needed delete + add).

``GET /v1/slownode`` lists jobs; ``GET /v1/slownode/<job>`` gives the FeatConf, placement, latest node
and cluster results, state (heavy profiling, degraded, reported ranks) and the last rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import Gauge

from clusterd.slownode.datatrace import DataTraceSwitch
from clusterd.slownode.edge import DetectorEdge
from clusterd.slownode.http import SlowNodeHttp
from clusterd.slownode.inputs import FeatConfFiles
from clusterd.slownode.jobs import (
    AGENT,
    EnableError,
    JobState,
    SlowNodeStateError,
    job_status,
    parse_placement,
    prefix,
)
from faultmesh._pb import agent_pb2
from faultmesh.jobspec import INT32_MAX
from faultmesh.log import event
from faultmesh.model import now_ms
from faultmesh.runtime import wait_for
from fdol.slownode.cluster import ClusterDetector
from fdol.slownode.degradation import DegradationTracker
from fdol.slownode.featconf import FeatConf, FeatConfError, parse_featconf
from fdol.slownode.switch import ALL_OFF, HEAVY, LIGHT

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.slownode")

STORE_NS = "slownode.jobs"


@dataclass(frozen=True)
class SlowNodeConfig:
    """Slow-node detection's configuration section (:func:`faultmesh.config.section`):
    ``slownode_watch_dir`` ``--slownode-watch-dir`` (empty: off), ``slownode_watch_interval``
    ``--slownode-watch-interval`` (s), ``slownode_once_ttl`` ``--slownode-once-ttl`` (s),
    ``slownode_cluster_name`` ``--slownode-cluster-name``; ``state_dir`` ``--state-dir`` (the
    default data-trace folder under it)."""

    slownode_watch_dir: str
    slownode_watch_interval: float
    slownode_once_ttl: float
    slownode_cluster_name: str
    state_dir: str


class SlowNodeComponent:
    """See the module docstring. Owns ``jobs`` (job id -> :class:`JobState`), their store records
    and the noded control messages; composes the data-trace switch, the detector edge
    (:class:`DetectorEdge`: node results, rounds, faults), the watched directory and the HTTP views,
    each given only the callables and the read-only job map it uses."""

    name = "slownode"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Flags ``--slownode-*``."""
        g = parser.add_argument_group("slownode (FD-OL)")
        g.add_argument(
            "--slownode-watch-dir",
            default="",
            help="directory watched for ras-feature-slownode-<job>.json files (empty: off)",
        )
        g.add_argument("--slownode-watch-interval", type=float, default=2.0, help="watch period (s)")
        g.add_argument(
            "--slownode-once-ttl",
            type=float,
            default=60.0,
            help="how long the once fault 100001011 stays in the fault center (s)",
        )
        g.add_argument("--slownode-cluster-name", default="clusterd", help="nodeRank of cluster results")

    def __init__(
        self,
        ctx: ClusterContext,
        cfg: SlowNodeConfig,
        jobs: JobRegistry | None = None,
        set_data_trace: Callable[[str, dict[str, str]], Awaitable[None]] | None = None,
        data_trace_root: str | None = None,
    ) -> None:
        """``cfg``: its section; ``jobs``: the brain's job registry (placement; does the brain own a job's data trace);
        ``set_data_trace``: the brain's hook for the jobs it knows; ``data_trace_root``: the folder of
        the switch files this component writes itself (default ``<state dir>/datatrace-config``)."""
        self.ctx = ctx
        self.cfg = cfg
        self.registry = jobs
        self.jobs: dict[str, JobState] = {}
        self._lock = asyncio.Lock()
        self._stops: dict[str, dict[str, JobState]] = {}  # node -> stopped jobs it was not told of yet
        reg, reject = ctx.metrics.registry, ctx.metrics.reject
        root = data_trace_root or str(Path(cfg.state_dir) / "datatrace-config")
        self.data_trace = DataTraceSwitch(root, ctx.agents.send, jobs, set_data_trace)
        self.edge = DetectorEdge(
            self.jobs, ctx.center, self.data_trace.set, ctx.tasks.spawn, cfg.slownode_once_ttl, reject, reg
        )
        self.m_jobs = Gauge("faultmesh_slownode_jobs", "Jobs with slow-node detection enabled", registry=reg)
        self.files = FeatConfFiles(self.jobs, self.enable, self.disable, self.resolve_placement, reject, reg)
        self.http = SlowNodeHttp(
            self.jobs, self._find, self.enable, self.disable, self.resolve_placement, reject
        )
        self.http.add_routes(ctx.http.app.router)
        ctx.agents.on_slownode_report(self.edge.on_report)
        ctx.agents.on_connect(self._on_connect)

    # what tests and the web views drive directly
    run_round = property(lambda self: self.edge.run_round)
    _on_report = property(lambda self: self.edge.on_report)

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Resume the stored jobs, start watching the FeatConf directory (when one is set)."""
        saved = await self.ctx.store.kv_items(STORE_NS)
        for job_id, d in sorted(saved.items()):
            try:
                conf = parse_featconf(d["featconf"])
                await self.enable(
                    conf, parse_placement(d["ranks"]), d.get("source", "http"), persist=False, resumed=True
                )
            except (FeatConfError, EnableError, KeyError, TypeError) as e:
                event(log, logging.ERROR, "slownode job not resumed", job=job_id, error=str(e))
        cfg = self.cfg
        if cfg.slownode_watch_dir:
            loop = self.files.loop(Path(cfg.slownode_watch_dir), cfg.slownode_watch_interval)
            self.ctx.tasks.spawn(loop, name="slownode-watch")

    async def stop(self) -> None:
        """Cancel the jobs' round loops (each waited for at most 2 s)."""
        for js in self.jobs.values():
            if js.task is not None:
                js.task.cancel()
        for js in self.jobs.values():
            if js.task is not None:
                try:
                    await wait_for(asyncio.shield(js.task), 2.0)
                except (asyncio.CancelledError, TimeoutError, Exception):  # noqa: BLE001 — shutting down
                    pass

    # -- job control ------------------------------------------------------------------------------
    def resolve_placement(self, conf: FeatConf, ranks: Any) -> dict[int, str]:
        """Placement from the request, else from the brain's job registry. Raises :class:`EnableError`."""
        if ranks is not None:
            return parse_placement(ranks)
        jobs = self.registry
        if jobs is not None:
            job = jobs.get(conf.job_id) or jobs.by_ns_name(conf.job_namespace, conf.job_name)
            if job is not None and job.ranks:
                return {r.rank: r.node for r in job.ranks}
        raise EnableError('no rank placement: give ranks {"<rank>": "<node>"} or register the job')

    async def enable(
        self,
        conf: FeatConf,
        placement: dict[int, str],
        source: str,
        *,
        persist: bool = True,
        resumed: bool = False,
    ) -> JobState:
        """Start or update detection of a job (stop when ``SlowNode`` is 0)."""
        async with self._lock:
            old = self.jobs.get(conf.job_id)
            if conf.slow_node == 0:
                await self._stop_job(conf.job_id, "SlowNode=0")
                return old  # type: ignore[return-value]
            if old is not None and old.conf == conf and old.placement == placement:
                return old
            bad = [r for r in placement if not 0 <= r <= INT32_MAX]
            if bad:  # ranks travel as int32 (SlowNodeJob.ranks)
                raise EnableError(f"rank {bad[0]} is outside 0..{INT32_MAX}")
            if persist:  # stored first: a failed write changes nothing (the old job keeps running)
                record = {
                    "featconf": conf.to_json(),
                    "ranks": {str(r): n for r, n in placement.items()},
                    "source": source,
                }
                try:
                    await self.ctx.store.kv_put(STORE_NS, conf.job_id, record)
                except TypeError as e:  # encoding: an integer beyond 64 bits, nothing can store or send it
                    raise EnableError(f"a value cannot be stored: {e}") from None
                except (sqlite3.Error, OSError) as e:
                    raise SlowNodeStateError(f"state write failed: {e}") from None
            if old is not None:
                await self._stop_job(conf.job_id, "updated", keep_store=True)
            js = JobState(
                conf,
                placement,
                source,
                ClusterDetector.for_conf(conf, self.cfg.slownode_cluster_name),
                DegradationTracker(conf),
                enabled_ms=now_ms(),
            )
            if resumed:
                self.edge.restore_degradation(js)
            self.jobs[conf.job_id] = js
            self.m_jobs.set(len(self.jobs))
            try:
                await self.data_trace.set(js.ns_name, HEAVY if js.tracker.heavy else LIGHT, js.nodes())
            except OSError as e:
                event(log, logging.ERROR, "data-trace switch write failed", job=conf.job_id, error=str(e))
            for node in js.nodes():
                await self._send_job(js, node, True)
            js.task = self.ctx.tasks.spawn(self.edge.round_loop(js), name=f"slownode-{conf.job_id}")
            event(
                log,
                logging.INFO,
                f"{prefix(conf)} slow node detection started",
                source=source,
                nodes=",".join(js.nodes()),
                ranks=len(placement),
                interval_s=conf.n_seconds,
                resumed=resumed,
            )
            if conf.unknown_keys:
                event(
                    log,
                    logging.WARNING,
                    "featconf unknown keys ignored",
                    job=conf.job_id,
                    keys=",".join(conf.unknown_keys),
                )
            return js

    async def disable(self, job: str) -> bool:
        """Stop a job (by id or name). Returns False when it was not enabled."""
        async with self._lock:
            js = self._find(job)
            if js is None:
                return False
            await self._stop_job(js.conf.job_id, "disabled")
            return True

    async def _stop_job(self, job_id: str, reason: str, keep_store: bool = False) -> None:
        """Stop a job; without ``keep_store`` its stored config is deleted first (a failed delete
        raises :class:`SlowNodeStateError` and changes nothing)."""
        if not keep_store:
            try:
                await self.ctx.store.kv_delete(STORE_NS, job_id)
            except (sqlite3.Error, OSError) as e:
                raise SlowNodeStateError(f"state write failed: {e}") from None
        js = self.jobs.pop(job_id, None)
        self.m_jobs.set(len(self.jobs))
        if js is None:
            return
        if js.task is not None:
            js.task.cancel()
        # a node with no stream now is told when it is back (_on_connect); one queued on a stream that
        # dies before noded acks it goes again on noded's next stream (clusterd.ingest.control)
        for node in js.nodes():
            if not await self._send_job(js, node, False):
                self._stops.setdefault(node, {})[job_id] = js
        if not keep_store:
            try:
                await self.data_trace.set(js.ns_name, ALL_OFF, js.nodes())
            except OSError as e:
                event(log, logging.ERROR, "data-trace switch write failed", job=job_id, error=str(e))
        await self.edge.clear_faults(js)
        self.edge.count_degraded()
        event(log, logging.INFO, f"{prefix(js.conf)} slow node detection stopped", reason=reason)

    async def _send_job(self, js: JobState, node: str, enable: bool) -> bool:
        c = js.conf
        msg = agent_pb2.SlowNodeJob(
            job_id=c.job_id,
            job_name=c.job_name,
            namespace=c.job_namespace,
            enable=enable,
            featconf_json=orjson.dumps(c.to_json()),
            ranks=js.ranks_on(node),
        )
        return await self.ctx.agents.send(node, AGENT, slownode_job=msg)

    async def _on_connect(self, node: str, agent: str) -> None:
        if agent != AGENT:
            return
        for job_id, js in list(self._stops.pop(node, {}).items()):
            if job_id not in self.jobs:  # still stopped: the noded may still run it
                await self._send_job(js, node, False)
        for js in list(self.jobs.values()):
            if node in js.placement.values():
                await self._send_job(js, node, True)

    def status(self, job_id: str, job_name: str = "") -> dict[str, Any] | None:
        """The ``GET /v1/slownode/<job>`` status of the job with id ``job_id`` (or, failing that, of
        the first enabled job named ``job_name``), None when detection is not enabled for it."""
        js = self.jobs.get(job_id)
        if js is None and job_name:
            js = next((j for _, j in sorted(self.jobs.items()) if j.conf.job_name == job_name), None)
        return job_status(js) if js else None

    def _find(self, job: str) -> JobState | None:
        js = self.jobs.get(job)
        if js is None:
            for j in self.jobs.values():
                if j.conf.job_name == job:
                    return j
        return js
