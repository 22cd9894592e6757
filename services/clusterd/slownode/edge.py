"""Slow-node detection: the detector edge between the agents, the pure FD-OL cluster detector
(:mod:`fdol.slownode.cluster`) and the fault center (see :mod:`clusterd.slownode`): node results in,
one cluster round per ``nSecondsDoOneDetection``, data-trace switches and the faults 110001010 /
100001011 out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from clusterd.slownode.jobs import CODE_RECOVERED, CODE_SLOW, SOURCE, JobState, go_ints, prefix
from faultmesh._pb import agent_pb2
from faultmesh.log import event
from faultmesh.model import NODE_DEVICE_ID, ONCE, Fault, FaultKey, now_ms
from fdol.slownode.switch import HEAVY, LIGHT

if TYPE_CHECKING:
    from clusterd.center import FaultCenter

log = logging.getLogger("clusterd.slownode")

# the keys of a node result that name ranks of that node only (fdol.slownode.node results)
LOCAL_RANK_KEYS = ("slowCalculateRanks", "slowSendRanks", "slowIORanks", "suspectRanks")


class DetectorEdge:
    """Node results and cluster rounds of the enabled ``jobs`` (read only). ``center``: the fault
    center (the only writer of this part's faults); ``switch(ns/name, switch, nodes)``: the
    data-trace switch; ``spawn``: the task owner's; ``once_ttl_s``: how long 100001011 stays;
    ``reject(service, reason)``: counts a bad node result."""

    def __init__(
        self,
        jobs: Mapping[str, JobState],
        center: FaultCenter,
        switch: Callable[[str, dict[str, str], list[str]], Awaitable[None]],
        spawn: Callable[..., asyncio.Task],
        once_ttl_s: float,
        reject: Callable[[str, str], None],
        registry: CollectorRegistry,
    ) -> None:
        self._jobs = jobs
        self._center = center
        self._switch_to = switch
        self._spawn = spawn
        self._once_ttl_s = once_ttl_s
        self._reject = reject
        self.m_reports = Counter("faultmesh_slownode_reports_total", "Node slow-node results received",
                                 ["result"], registry=registry)  # fmt: skip
        self.m_rounds = Counter("faultmesh_slownode_cluster_rounds_total", "Cluster detection rounds",
                                ["slow"], registry=registry)  # fmt: skip
        self.m_degraded = Gauge("faultmesh_slownode_degraded_jobs", "Jobs confirmed slow", registry=registry)

    def count_degraded(self) -> None:
        """Set the gauge of jobs confirmed slow."""
        self.m_degraded.set(sum(1 for j in self._jobs.values() if j.tracker.degraded))

    # -- node reports -----------------------------------------------------------------------------
    def on_report(self, node: str, report: agent_pb2.SlowNodeReport) -> None:
        """A node result from ``node``'s noded: checked (job enabled, JSON shape, ranks placed on that
        node), counted, and handed to the job's detector; a bad one is logged and counted."""
        js = self._jobs.get(report.job_id)
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
            self._reject("slownode", "bad_report")
            event(
                log, logging.WARNING, "slownode report rejected", node=node, job=report.job_id, error=repr(e)
            )
            return
        if not js.ranks_on(node):
            self.m_reports.labels("foreign_node").inc()
            return
        if foreign := named.difference(js.ranks_on(node)):  # computed for an older placement
            self.m_reports.labels("foreign_rank").inc()
            self._reject("slownode", "foreign_rank")
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
    async def round_loop(self, js: JobState) -> None:
        """Run a round of ``js`` every ``nSecondsDoOneDetection`` until cancelled."""
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
        self.count_degraded()
        return res

    async def _switch(self, js: JobState, sw: dict[str, str]) -> None:
        try:
            await self._switch_to(js.ns_name, sw, js.nodes())
        except Exception as e:  # noqa: BLE001 — the brain may refuse; detection goes on
            event(log, logging.ERROR, "data-trace switch failed", job=js.conf.job_id, error=repr(e))

    # -- faults -----------------------------------------------------------------------------------
    def restore_degradation(self, js: JobState) -> None:
        """After a restart: a 110001010 fault of this job still in the fault center means the job was
        confirmed slow; resume in that state so recovery removes the fault."""
        ranks: set[int] = set()
        for f in self._center.faults():
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

    def _job_attrs(self, js: JobState) -> dict[str, str]:
        c = js.conf
        return {"jobId": c.job_id, "jobName": c.job_name, "namespace": c.job_namespace}

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
            await self._center.remove(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_RECOVERED, SOURCE))
            attrs = {
                **self._job_attrs(js),
                "influence": ",".join(str(r) for r in rs),
                "degradationLevel": res.get("degradationLevel", ""),
                "description": "slow node detected by FD-OL",
            }
            f = Fault(
                SOURCE, node, "Node", NODE_DEVICE_ID, CODE_SLOW, "SubHealthFault", "occur", now, now, attrs
            )
            await self._center.upsert(f, origin=SOURCE)
            js.faulted_nodes.add(node)
        event(
            log, logging.INFO, f"{prefix(js.conf)} report slow node detection: {go_ints(ranks)} successfully"
        )

    async def _recover(self, js: JobState, ranks: list[int]) -> None:
        now = now_ms()
        for node in sorted(js.faulted_nodes):
            await self._center.remove(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_SLOW, SOURCE))
            attrs = {
                **self._job_attrs(js),
                "influence": ",".join(str(r) for r in ranks if js.placement.get(r) == node),
                "description": "slow node recovered",
            }
            f = Fault(
                SOURCE, node, "Node", NODE_DEVICE_ID, CODE_RECOVERED, "NotHandleFault", ONCE, now, now, attrs
            )
            await self._center.upsert(f, origin=SOURCE)
            self._spawn(
                self._expire(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_RECOVERED, SOURCE), now),
                name="slownode-once-expire",
            )
        js.faulted_nodes.clear()
        event(log, logging.INFO, f"{prefix(js.conf)} slow node recovered, slow rank ids: {go_ints(ranks)}")

    async def _expire(self, key: FaultKey, added_ms: int) -> None:
        await asyncio.sleep(self._once_ttl_s)
        f = self._center.get(key)
        if f is not None and f.last_seen_ms == added_ms:
            await self._center.remove(key)

    async def clear_faults(self, js: JobState) -> None:
        """Remove the job's 110001010 faults (the job stopped)."""
        for node in sorted(js.faulted_nodes):
            await self._center.remove(FaultKey(node, "Node", NODE_DEVICE_ID, CODE_SLOW, SOURCE))
        js.faulted_nodes.clear()
