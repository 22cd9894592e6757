"""FD-OL slow-node detection, cluster part, inside ClusterD (issue 5; reference fdol.md §3, §5–7).

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
changed and :class:`~fdol.slownode.cluster.DegradationTracker` decides. Actions:
communication profiling on/off through :meth:`SlowNodeComponent.set_data_trace` (initial phase on; first slow round on;
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
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import Counter, Gauge

from clusterd.brain.datatrace import switch_message, write_switch
from clusterd.slownode_http import SlowNodeHttp
from clusterd.slownode_jobs import (
    EnableError,
    JobState,
    SlowNodeStateError,
    go_ints,
    parse_placement,
    prefix,
)
from faultmesh._pb import agent_pb2
from faultmesh.files import DirWatch
from faultmesh.jobspec import INT32_MAX
from faultmesh.log import event
from faultmesh.model import NODE_DEVICE_ID, ONCE, Fault, FaultKey, now_ms
from faultmesh.runtime import wait_for
from fdol.slownode.cluster import ClusterDetector, DegradationTracker
from fdol.slownode.featconf import FeatConf, FeatConfError, parse_featconf
from fdol.slownode.switch import ALL_OFF, HEAVY, LIGHT, SWITCH_FILE, switch_dir_name

if TYPE_CHECKING:
    from clusterd.brain.jobs import JobRegistry
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.slownode")


SOURCE = "fd-online"
CODE_SLOW = "110001010"
CODE_RECOVERED = "100001011"
STORE_NS = "slownode.jobs"
# the keys of a node result that name ranks of that node only (fdol.slownode.node results)
LOCAL_RANK_KEYS = ("slowCalculateRanks", "slowSendRanks", "slowIORanks", "suspectRanks")


class SlowNodeComponent(SlowNodeHttp):
    """See the module docstring."""

    name = "slownode"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
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
        jobs: JobRegistry | None = None,
        set_data_trace: Callable[[str, dict[str, str]], Awaitable[None]] | None = None,
        data_trace_root: str | None = None,
    ) -> None:
        """``jobs``: the brain's job registry (placement; does the brain own a job's data trace);
        ``set_data_trace``: the brain's hook for the jobs it knows; ``data_trace_root``: the folder of
        the switch files this component writes itself (default ``<state dir>/datatrace-config``)."""
        self.ctx = ctx
        self.registry = jobs
        self._brain_data_trace = set_data_trace
        self.data_trace_root = data_trace_root or str(Path(ctx.config.state_dir) / "datatrace-config")
        self.jobs: dict[str, JobState] = {}
        self._watch: DirWatch | None = None
        self._watch_jobs: dict[str, str] = {}  # file name -> job id
        self._lock = asyncio.Lock()
        self._stops: dict[str, dict[str, JobState]] = {}  # node -> stopped jobs it was not told of yet
        reg = ctx.metrics.registry
        self.m_reports = Counter("faultmesh_slownode_reports_total", "Node slow-node results received",
                                 ["result"], registry=reg)  # fmt: skip
        self.m_rounds = Counter("faultmesh_slownode_cluster_rounds_total", "Cluster detection rounds",
                                ["slow"], registry=reg)  # fmt: skip
        self.m_jobs = Gauge("faultmesh_slownode_jobs", "Jobs with slow-node detection enabled", registry=reg)
        self.m_degraded = Gauge("faultmesh_slownode_degraded_jobs", "Jobs confirmed slow", registry=reg)
        self.m_files = Counter("faultmesh_slownode_watch_files_total", "Watched FeatConf files",
                               ["result"], registry=reg)  # fmt: skip
        r = ctx.http.app.router
        r.add_get("/v1/slownode", self._http_list)
        r.add_post("/v1/slownode/jobs", self._http_enable)
        r.add_get("/v1/slownode/{job}", self._http_get)
        r.add_post("/v1/slownode/{job}/disable", self._http_disable)
        r.add_delete("/v1/slownode/{job}", self._http_disable)
        ctx.agents.on_slownode_report(self._on_report)
        ctx.agents.on_connect(self._on_connect)

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        saved = await self.ctx.store.kv_items(STORE_NS)
        for job_id, d in sorted(saved.items()):
            try:
                conf = parse_featconf(d["featconf"])
                await self.enable(
                    conf, parse_placement(d["ranks"]), d.get("source", "http"), persist=False, resumed=True
                )
            except (FeatConfError, EnableError, KeyError, TypeError) as e:
                event(log, logging.ERROR, "slownode job not resumed", job=job_id, error=str(e))
        if self.ctx.config.slownode_watch_dir:
            self.ctx.tasks.spawn(self._watch_loop(), name="slownode-watch")

    async def stop(self) -> None:
        for js in self.jobs.values():
            if js.task is not None:
                js.task.cancel()
        for js in self.jobs.values():
            if js.task is not None:
                try:
                    await wait_for(asyncio.shield(js.task), 2.0)
                except (asyncio.CancelledError, TimeoutError, Exception):  # noqa: BLE001 — shutting down
                    pass

    # -- data trace -------------------------------------------------------------------------------
    async def set_data_trace(
        self, job_ns_name: str, switch_dict: dict[str, str], nodes: list[str] | None = None
    ) -> None:
        """Set a job's data-trace switch — the one hook FD-OL uses (reference fdol.md §1.1).

        When the brain (issue 7) knows the job, its TrainingDataTrace service does it (file, state,
        subscribers, ``data_trace`` control to the job's nodes). Otherwise this writes
        ``<root>/<ns>.data-trace-<job>/profilingSwitch`` itself and sends a ``data_trace`` control
        message to ``nodes``. Raises ``OSError`` when the file cannot be written.
        """
        ns, _, name = job_ns_name.partition("/")
        reg = self.registry
        if self._brain_data_trace is not None and reg is not None and reg.by_ns_name(ns, name) is not None:
            await self._brain_data_trace(job_ns_name, switch_dict)
            return
        path = Path(self.data_trace_root) / switch_dir_name(ns, name) / SWITCH_FILE
        await asyncio.to_thread(write_switch, path, orjson.dumps(switch_dict))
        msg = switch_message(job_ns_name, switch_dict)
        for node in nodes or []:
            await self.ctx.agents.send(node, "noded", data_trace=msg)

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
                ClusterDetector.for_conf(conf, self.ctx.config.slownode_cluster_name),
                DegradationTracker(conf),
                enabled_ms=now_ms(),
            )
            if resumed:
                self._restore_degradation(js)
            self.jobs[conf.job_id] = js
            self.m_jobs.set(len(self.jobs))
            try:
                await self.set_data_trace(js.ns_name, HEAVY if js.tracker.heavy else LIGHT, js.nodes())
            except OSError as e:
                event(log, logging.ERROR, "data-trace switch write failed", job=conf.job_id, error=str(e))
            for node in js.nodes():
                await self._send_job(js, node, True)
            js.task = self.ctx.tasks.spawn(self._round_loop(js), name=f"slownode-{conf.job_id}")
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

    def _restore_degradation(self, js: JobState) -> None:
        """After a restart: a 110001010 fault of this job still in the fault center means the job was
        confirmed slow; resume in that state so recovery removes the fault."""
        ranks: set[int] = set()
        for f in self.ctx.center.faults():
            if f.source == SOURCE and f.code == CODE_SLOW and f.attributes.get("jobId") == js.conf.job_id:
                js.faulted_nodes.add(f.node)
                ranks.update(
                    int(x) for x in f.attributes.get("influence", "").split(",") if x.strip().isdigit()
                )
        if js.faulted_nodes:
            js.tracker.degraded = True
            js.tracker.reported_ranks = sorted(ranks)
            js.tracker.heavy = False
            js.tracker.heavy_reason = ""

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
        for node in js.nodes():  # a node away now is told when it is back (_on_connect)
            if not await self._send_job(js, node, False):
                self._stops.setdefault(node, {})[job_id] = js
        if not keep_store:
            try:
                await self.set_data_trace(js.ns_name, ALL_OFF, js.nodes())
            except OSError as e:
                event(log, logging.ERROR, "data-trace switch write failed", job=job_id, error=str(e))
        await self._clear_faults(js)
        self.m_degraded.set(sum(1 for j in self.jobs.values() if j.tracker.degraded))
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
        return await self.ctx.agents.send(node, "noded", slownode_job=msg)

    async def _on_connect(self, node: str, agent: str) -> None:
        if agent != "noded":
            return
        for job_id, js in list(self._stops.pop(node, {}).items()):
            if job_id not in self.jobs:  # still stopped: the noded may still run it
                await self._send_job(js, node, False)
        for js in list(self.jobs.values()):
            if node in js.placement.values():
                await self._send_job(js, node, True)

    def _find(self, job: str) -> JobState | None:
        js = self.jobs.get(job)
        if js is None:
            for j in self.jobs.values():
                if j.conf.job_name == job:
                    return j
        return js

    # -- node reports -----------------------------------------------------------------------------
    def _on_report(self, node: str, report: agent_pb2.SlowNodeReport) -> None:
        js = self.jobs.get(report.job_id)
        if js is None:
            self.m_reports.labels("unknown_job").inc()
            return
        try:
            obj = orjson.loads(report.result_json)
            inner = obj[f"slownode_{report.job_id}"]
            (res,) = inner.values()
            if not isinstance(res, dict):
                raise TypeError("result is not an object")
            named = {int(r) for k in LOCAL_RANK_KEYS for r in res.get(k) or ()}  # ranks it names
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            self.m_reports.labels("bad").inc()
            self.ctx.metrics.reject("slownode", "bad_report")
            event(
                log, logging.WARNING, "slownode report rejected", node=node, job=report.job_id, error=repr(e)
            )
            return
        if not js.ranks_on(node):
            self.m_reports.labels("foreign_node").inc()
            return
        if foreign := named.difference(js.ranks_on(node)):  # computed for an older placement
            self.m_reports.labels("foreign_rank").inc()
            self.ctx.metrics.reject("slownode", "foreign_rank")
            event(
                log,
                logging.WARNING,
                "slownode report rejected",
                node=node,
                job=report.job_id,
                reason="ranks not placed on this node",
                ranks=go_ints(sorted(foreign)),
            )
            return
        self.m_reports.labels("slow" if res.get("isSlow") == 1 else "normal").inc()
        res["reportedMs"] = report.timestamp_ms or now_ms()
        js.detector.add_report(node, res)

    # -- rounds -----------------------------------------------------------------------------------
    async def _round_loop(self, js: JobState) -> None:
        interval = js.conf.n_seconds
        next_t = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            next_t += interval
            if next_t < time.monotonic():
                next_t = time.monotonic() + interval
            try:
                await self.run_round(js)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug in one round must not end the job's detection
                event(log, logging.ERROR, "slownode round failed", job=js.conf.job_id, error=repr(e))

    async def run_round(self, js: JobState) -> dict | None:
        """One cluster round of ``js``: merge, decide, act. Returns the cluster result or None."""
        res = js.detector.round()
        if res is None:
            return None
        ready = js.detector.all_baseline_ready(js.nodes())
        actions = js.tracker.on_round(res, ready)
        js.latest = res
        self.m_rounds.labels(str(res["isSlow"])).inc()
        js.rounds.append(
            {
                "round": js.detector.rounds,
                "ms": now_ms(),
                "isSlow": res["isSlow"],
                "slowCalculateRanks": res["slowCalculateRanks"],
                "suspectRanks": res["suspectRanks"],
                "actions": [a.kind for a in actions],
                "heavy": js.tracker.heavy,
                "degraded": js.tracker.degraded,
            }
        )
        p = prefix(js.conf)
        for a in actions:
            if a.kind == "heavy_on":
                msg = (
                    "detected node is degradation, start heavy profiling"
                    if res["isSlow"] == 1
                    else "detected suspect ranks, start heavy profiling"
                )
                event(log, logging.INFO, f"{p} {msg}")
                await self._switch(js, HEAVY)
            elif a.kind == "heavy_off":
                event(log, logging.INFO, f"{p} detected node is not degradation, stop heavy profiling")
                await self._switch(js, LIGHT)
            elif a.kind == "confirm" and not a.ranks:
                event(log, logging.INFO, f"{p} in cluster got degradation, slow rank ids not localized yet")
            elif a.kind == "report":
                event(log, logging.INFO, f"{p} in cluster got degradation, slow rank ids: {go_ints(a.ranks)}")
                await self._report(js, a.ranks, res)
            elif a.kind == "recover":
                await self._recover(js, a.ranks)
        if js.tracker.degraded and res["isSlow"] == 1 and not actions:
            event(log, logging.DEBUG, f"{p} in cluster got degradation, no need to start heavy profiling")
        self.m_degraded.set(sum(1 for j in self.jobs.values() if j.tracker.degraded))
        return res

    async def _switch(self, js: JobState, sw: dict[str, str]) -> None:
        try:
            await self.set_data_trace(js.ns_name, sw, js.nodes())
        except Exception as e:  # noqa: BLE001 — the brain may refuse; detection goes on
            event(log, logging.ERROR, "data-trace switch failed", job=js.conf.job_id, error=repr(e))

    async def _report(self, js: JobState, ranks: list[int], res: dict) -> None:
        now = now_ms()
        by_node: dict[str, list[int]] = {}
        for r in ranks:
            by_node.setdefault(js.placement.get(r, ""), []).append(r)
        for node, rs in sorted(by_node.items()):
            if not node:
                event(
                    log, logging.WARNING, "slow rank without placement", job=js.conf.job_id, ranks=go_ints(rs)
                )
                continue
            await self.ctx.center.remove(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_RECOVERED, SOURCE))
            f = Fault(
                SOURCE,
                node,
                "Node",
                NODE_DEVICE_ID,
                CODE_SLOW,
                "SubHealthFault",
                "occur",
                now,
                now,
                {
                    "jobId": js.conf.job_id,
                    "jobName": js.conf.job_name,
                    "namespace": js.conf.job_namespace,
                    "influence": ",".join(str(r) for r in rs),
                    "degradationLevel": res.get("degradationLevel", ""),
                    "description": "slow node detected by FD-OL",
                },
            )
            await self.ctx.center.upsert(f, origin=SOURCE)
            js.faulted_nodes.add(node)
        event(
            log, logging.INFO, f"{prefix(js.conf)} report slow node detection: {go_ints(ranks)} successfully"
        )

    async def _recover(self, js: JobState, ranks: list[int]) -> None:
        now = now_ms()
        for node in sorted(js.faulted_nodes):
            await self.ctx.center.remove(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_SLOW, SOURCE))
            f = Fault(
                SOURCE,
                node,
                "Node",
                NODE_DEVICE_ID,
                CODE_RECOVERED,
                "NotHandleFault",
                ONCE,
                now,
                now,
                {
                    "jobId": js.conf.job_id,
                    "jobName": js.conf.job_name,
                    "namespace": js.conf.job_namespace,
                    "influence": ",".join(str(r) for r in ranks if js.placement.get(r) == node),
                    "description": "slow node recovered",
                },
            )
            await self.ctx.center.upsert(f, origin=SOURCE)
            self.ctx.tasks.spawn(
                self._expire(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_RECOVERED, SOURCE), now),
                name="slownode-once-expire",
            )
        js.faulted_nodes.clear()
        event(log, logging.INFO, f"{prefix(js.conf)} slow node recovered, slow rank ids: {go_ints(ranks)}")

    async def _expire(self, key: FaultKey, added_ms: int) -> None:
        await asyncio.sleep(self.ctx.config.slownode_once_ttl)
        f = self.ctx.center.get(key)
        if f is not None and f.last_seen_ms == added_ms:
            await self.ctx.center.remove(key)

    async def _clear_faults(self, js: JobState) -> None:
        for node in sorted(js.faulted_nodes):
            await self.ctx.center.remove(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_SLOW, SOURCE))
        js.faulted_nodes.clear()
