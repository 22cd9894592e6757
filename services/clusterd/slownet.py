"""ClusterD's slow-network component (FD-OL netfault): ping lists out, pingmesh rows in, alarms as
faults.

Source: reference fdol.md §8 (topology -> ping lists, period loop, window, localization,
suppression, codes 200001010/200001011/200001012) and noded.md §6 (220001001 for an unreachable
card; ``pingmesh-config``). Pure analysis: :mod:`fdol.slownet`.

Inputs:
- super-pod topologies from ``--slownet-topology`` (a ``super-pod-<id>.json`` file or a folder of
  them; re-read when changed) or ``POST /v1/pingmesh/topology`` (body: the reference JSON);
- pingmesh-config from ``--slownet-config`` (ConfigMap YAML or JSON) or ``POST /v1/pingmesh/config``;
- with ``--kube``, the ``pingmesh-config`` and ``super-pod-<id>`` ConfigMaps, and clusterd writes
  ``pingmesh-fault-<node>`` (:mod:`clusterd.slownet_kube`);
- the RoCE parameter plane between super pods, built from the topologies' ``RoceIP`` when the
  config has a ``roce`` entry (:mod:`clusterd.slownet_roce`).
Both are kept in the state store (namespace ``slownet``) and survive restarts. A bad input is
rejected (HTTP 400 / logged and counted) and the previous one stays. POSTs need the bearer token
when clusterd has ``--token-file``.

Outputs to each noded of a super pod (on change and again on every reconnect): its pingmesh config,
the topology and its ping list (:func:`fdol.slownet.pinglist.generate`). Rows arrive through
``agents.on_ping_results`` and are analysed once per period (``--slownet-period-s``, default
10 x task_interval): period ``k`` = ``[kP, (k+1)P)`` is analysed ``--slownet-grace-s`` after it ends
(rows may wait up to noded's report interval). Analysis runs in a worker thread. Alarms become fault
records of source ``slownet`` (origin ``slownet``) in the fault center and recover when the paths are
healthy again; faults restored at start are kept until the analysis has warmed up.

``GET /v1/pingmesh`` (all super pods) and ``GET /v1/pingmesh/<id>``: config, latest matrix summary,
open alarms, unreachable cards, skipped-row counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from clusterd.detectors import fdol_edge as edge
from clusterd.detectors.fdol_edge import SOURCE
from clusterd.slownet_http import AGENT, SlowNetHttp
from clusterd.slownet_inputs import SlowNetInputs
from clusterd.slownet_kube import PingmeshConfigMaps
from clusterd.slownet_roce import SlowNetRoce
from faultmesh._pb import agent_pb2
from faultmesh.files import FileWatch, Stamp
from faultmesh.log import event
from faultmesh.model import Fault, FaultKey
from faultmesh.runtime import wait_for
from fdol.slownet import config as pmconfig
from fdol.slownet import pinglist as pl
from fdol.slownet import roce
from fdol.slownet import topology as topo
from fdol.slownet.analyzer import AnalyzerParams, SuperPodAnalyzer
from fdol.slownet.window import PingRow

if TYPE_CHECKING:
    from clusterd.context import ClusterContext

log = logging.getLogger("clusterd.slownet")

NS = "slownet"
ANALYSIS_TIMEOUT_S = 60.0
TICK_S = 0.25


class _Pod:
    """One super pod: topology, ping list, analyzer, pending rows, timing."""

    def __init__(self, sp: topo.SuperPod, pairs: list[pl.PingPair], params: AnalyzerParams) -> None:
        self.sp = sp
        self.pairs = pairs
        self.by_node = pl.by_node(pairs)
        self.analyzer = SuperPodAnalyzer(sp, pairs, params)
        self.pending: list[PingRow] = []
        self.last_period: int | None = None
        self.first_period: int | None = None
        self.status: dict[str, Any] = edge.status_json(self.analyzer.status())
        self.last_analysis_ms = 0
        self.analysis_s = 0.0
        self.faults: list[Fault] = []  # fault records of the last analysis (read on the loop)
        self.active = True


class SlowNetComponent(SlowNetInputs, SlowNetHttp, SlowNetRoce):
    """The clusterd slow-network component (module doc)."""

    name = "slownet"

    @staticmethod
    def add_arguments(parser) -> None:
        """Flags ``--slownet-*``."""
        g = parser.add_argument_group("slow network (pingmesh)")
        g.add_argument("--slownet-topology", help="super-pod-<id>.json file or a folder of them")
        g.add_argument("--slownet-config", help="pingmesh-config file (ConfigMap YAML or JSON)")
        g.add_argument(
            "--slownet-period-s", type=float, default=0.0, help="detection period (s); 0 = 10 x task_interval"
        )
        g.add_argument("--slownet-grace-s", type=float, default=-1.0,
                       help="wait after a period ends before analysing it (s); -1 = max(P/2, 6 s)")  # fmt: skip
        g.add_argument("--slownet-suppress-s", type=float, default=300.0, help="alarm suppression period (s)")
        g.add_argument(
            "--slownet-intra", choices=("mesh", "ring"), default="mesh", help="intra-node ping list rule"
        )
        g.add_argument(
            "--slownet-loss-abs-pct", type=float, default=20.0, help="loss %% faulty whatever the baseline"
        )
        g.add_argument(
            "--slownet-delay-abs",
            type=float,
            default=0.0,
            help="delay faulty whatever the baseline (0 = off)",
        )
        g.add_argument(
            "--slownet-min-baseline", type=int, default=3, help="clean baseline periods for a threshold"
        )
        g.add_argument(
            "--slownet-recover-periods", type=int, default=2, help="healthy periods before recovery"
        )
        g.add_argument(
            "--slownet-stale-periods",
            type=int,
            default=6,
            help="periods without data before an alarm is dropped",
        )
        g.add_argument("--slownet-file-poll-s", type=float, default=10.0, help="input file poll interval (s)")
        g.add_argument(
            "--slownet-csv-root",
            help="also read ping_result_*.csv[-bak] under <root>/cluster/super-pod-<id>/",
        )

    def __init__(self, ctx: ClusterContext, kube: Any = None) -> None:
        """``kube``: clusterd's Kubernetes component (its leader election gates the ConfigMap writes)."""
        self.ctx = ctx
        self.kube_component = kube
        self.args = ctx.config
        self.pods: dict[str, _Pod] = {}
        self.config: dict[str, pmconfig.Activation] = {}
        self.node_pod: dict[str, str] = {}
        self.current: dict[FaultKey, Fault] = {}
        self._restored: set[FaultKey] = set()
        self._watches: dict[str, FileWatch] = {}  # input file -> its change detector
        self._workers: dict[str, asyncio.Future] = {}
        self._csv_stamp: dict[str, Stamp] = {}  # CSV file -> (mtime_ns, size) last read
        self._csv_newest: dict[str, int] = {}  # ping_result_<idx> series -> newest row ts taken (ms)
        self.kube: PingmeshConfigMaps | None = None
        reg = ctx.metrics.registry
        self.m_rows = Counter(
            "faultmesh_slownet_rows_total", "pingmesh rows received by result", ["result"], registry=reg
        )
        self.m_alarms = Gauge(
            "faultmesh_slownet_alarms", "open slow-network alarms", ["super_pod"], registry=reg
        )
        self.m_faulty = Gauge(
            "faultmesh_slownet_faulty_paths", "faulty paths in the last period", ["super_pod"], registry=reg
        )
        self.m_time = Histogram(
            "faultmesh_slownet_analysis_seconds", "time of one period's analysis", registry=reg
        )
        self.m_inputs = Counter(
            "faultmesh_slownet_inputs_rejected_total", "rejected inputs", ["kind"], registry=reg
        )
        ctx.agents.on_connect(self._on_connect)
        ctx.agents.on_ping_results(self._on_rows)
        r = ctx.http.app.router
        r.add_get("/v1/pingmesh", self._http_all)
        r.add_get("/v1/pingmesh/{spid}", self._http_one)
        r.add_post("/v1/pingmesh/topology", self._http_topology)
        r.add_post("/v1/pingmesh/config", self._http_config)

    # -- parameters -------------------------------------------------------------------------------
    def activation(self, spid: str) -> pmconfig.Activation | None:
        """The pingmesh-config entry of a super pod (None: not configured)."""
        return pmconfig.for_super_pod(self.config, spid)

    def period_s(self, spid: str) -> float:
        """Detection period of a super pod (s)."""
        if self.args.slownet_period_s > 0:
            return self.args.slownet_period_s
        act = self.activation(spid)
        return float(act.period_s if act else 10)

    def grace_s(self, spid: str) -> float:
        """Wait after a period's end before analysing it (s)."""
        if self.args.slownet_grace_s >= 0:
            return self.args.slownet_grace_s
        return max(self.period_s(spid) / 2, 6.0)

    def _params(self, spid: str) -> AnalyzerParams:
        a = self.args
        return AnalyzerParams(
            period_ms=int(self.period_s(spid) * 1000),
            min_baseline=a.slownet_min_baseline,
            loss_abs_pct=a.slownet_loss_abs_pct if a.slownet_loss_abs_pct > 0 else None,
            delay_abs=a.slownet_delay_abs if a.slownet_delay_abs > 0 else None,
            recover_periods=a.slownet_recover_periods,
            stale_periods=a.slownet_stale_periods,
            suppress_s=a.slownet_suppress_s,
        )

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Restore stored inputs and faults, read input files, push lists, start the period loop."""
        stored = await self.ctx.store.kv_items(NS)
        if "config" in stored:
            with contextlib.suppress(ValueError):
                self.config = pmconfig.parse_config(stored["config"])
        for key, value in sorted(stored.items()):
            if key.startswith("topology:"):
                try:
                    self._install(topo.parse_super_pod(value))
                except ValueError as e:
                    event(log, logging.WARNING, "stored topology dropped", key=key, error=str(e))
        self._rebuild_roce()
        self.current = {f.key: f for f in self.ctx.center.faults() if f.source == SOURCE}
        self._restored = set(self.current)
        await self._poll_files()
        for spid in list(self.pods):
            await self._push_pod(spid)
        self.ctx.tasks.spawn(self._loop(), name="slownet")
        if getattr(self.args, "kube", False):  # the pingmesh control ConfigMaps (issue 15)
            self.kube = PingmeshConfigMaps(self, self.kube_component)
            await self.kube.start()
        event(
            log, logging.INFO, "slownet started", super_pods=len(self.pods), restored_faults=len(self.current)
        )

    async def stop(self) -> None:
        """Close the Kubernetes client; nothing to flush: inputs are stored when they change, faults
        live in the fault center."""
        if self.kube is not None:
            await self.kube.stop()

    # -- inputs -----------------------------------------------------------------------------------
    def _install(self, sp: topo.SuperPod) -> _Pod:
        pairs = pl.generate(sp, intra=self.args.slownet_intra)
        pod = self.pods.get(sp.super_pod_id)
        if pod is None:
            pod = _Pod(sp, pairs, self._params(sp.super_pod_id))
            self.pods[sp.super_pod_id] = pod
        else:
            pod.sp, pod.pairs, pod.by_node = sp, pairs, pl.by_node(pairs)
            pod.analyzer.set_topology(sp, pairs)
        for node, spid in list(self.node_pod.items()):
            if spid == sp.super_pod_id and node not in sp.nodes:
                del self.node_pod[node]
        for node in sp.nodes:
            self.node_pod[node] = sp.super_pod_id
        return pod

    async def set_topology(self, sp: topo.SuperPod, origin: str) -> None:
        """Use a (validated) topology: store it, regenerate the ping lists, push them."""
        if sp.super_pod_id == roce.PLANE_ID:
            raise ValueError("super pod id 'roce' is the RoCE plane's")
        for other in self.pods.values():
            if other.sp.super_pod_id == roce.PLANE_ID:
                continue  # the RoCE plane's nodes are the super pods' own
            clash = set(other.sp.nodes) & set(sp.nodes)
            if other.sp.super_pod_id != sp.super_pod_id and clash:
                raise ValueError(
                    f"nodes {sorted(clash)[:3]} already belong to super pod {other.sp.super_pod_id}"
                )
        self._install(sp)
        self._rebuild_roce()
        await self.ctx.store.kv_put(NS, f"topology:{sp.super_pod_id}", sp.to_json_obj())
        event(log, logging.INFO, "slownet topology applied", origin=origin, super_pod=sp.super_pod_id,
              nodes=len(sp.nodes), npus=sp.npu_count, paths=len(self.pods[sp.super_pod_id].pairs))  # fmt: skip
        await self._push_pod(sp.super_pod_id)
        if roce.PLANE_ID in self.pods:
            await self._push_pod(roce.PLANE_ID)

    async def set_config(self, cfg: dict[str, pmconfig.Activation], origin: str) -> None:
        """Use a (validated) pingmesh-config: store it, rebuild analyzers whose period changed, push."""
        self.config = cfg
        await self.ctx.store.kv_put(NS, "config", pmconfig.to_json_obj(cfg))
        for spid, pod in self.pods.items():
            params = self._params(spid)
            if params.period_ms != pod.analyzer.params.period_ms:
                self.pods[spid] = _Pod(pod.sp, pod.pairs, params)
                # a new window: keep this pod's faults until the analysis has warmed up again
                self._restored |= {
                    k for k, f in self.current.items() if f.attributes.get("superPodId") == spid
                }
        self._rebuild_roce()
        event(log, logging.INFO, "slownet config applied", origin=origin, keys=",".join(sorted(cfg)))
        for spid in list(self.pods):
            await self._push_pod(spid)

    async def _poll_csv(self) -> None:
        if not self.args.slownet_csv_root:
            return
        found = await self._in_thread("csv", self._scan_csv, sorted(self.pods))
        for spid, (rows, bad) in found.items():
            if bad:
                self.m_rows.labels("csv_bad_line").inc(bad)
            pod = self.pods.get(spid)
            if pod is not None and rows:
                plane = self.roce_plane if spid == roce.PLANE_ID else None
                pod.pending.extend(plane.to_plane_row(r.row()) if plane else r.row() for r in rows)

    # -- agents -----------------------------------------------------------------------------------
    async def _push_node(self, spid: str, node: str) -> bool:
        if spid == roce.PLANE_ID:
            return await self._push_roce(node)  # the config and topology go with the node's own pod
        pod = self.pods[spid]
        send = self.ctx.agents.send
        ok = True
        if self.config:
            ok &= await send(node, AGENT, pingmesh_config=edge.config_to_pb(self.config))
        ok &= await send(node, AGENT, topology=edge.topology_to_pb(pod.sp))
        lst = pl.node_ping_list(spid, pod.by_node.get(node, []))
        ok &= await send(node, AGENT, ping_list=edge.ping_list_to_pb(lst))
        return ok

    async def _push_pod(self, spid: str) -> None:
        connected = {n for n, a in self.ctx.agents.connected() if a == AGENT}
        sent = 0
        for node in sorted(self.pods[spid].sp.nodes):
            if node in connected and await self._push_node(spid, node):
                sent += 1
        event(log, logging.INFO, "slownet lists pushed", super_pod=spid, nodes=sent)

    async def _on_connect(self, node: str, agent: str) -> None:
        spid = self.node_pod.get(node)
        if agent == AGENT and spid is not None:
            await self._push_node(spid, node)
            await self._push_roce(node)

    def _on_rows(self, node: str, rows: list[agent_pb2.PingResult]) -> None:
        spid_default = self.node_pod.get(node)
        for r in rows:
            spid = r.super_pod_id or spid_default
            pod = self.pods.get(spid) if spid is not None else None
            if pod is None or node not in pod.sp.nodes:
                self.m_rows.labels("unknown_super_pod").inc()
                continue
            row = edge.row_from_pb(r)
            if spid == roce.PLANE_ID and self.roce_plane is not None:
                row = self.roce_plane.to_plane_row(row)  # IPs -> the plane's SDIDs
            pod.pending.append(row)

    # -- analysis ---------------------------------------------------------------------------------
    def _analyze_blocking(self, pod: _Pod, rows: list[PingRow], periods: list[int], now_ms: int) -> dict:
        t0 = time.perf_counter()
        counts = pod.analyzer.ingest(rows, now_ms)
        reports = [pod.analyzer.analyze(k, now_s=now_ms / 1000) for k in periods]
        faults = edge.faults(pod.analyzer.detections())
        status = edge.status_json(pod.analyzer.status())
        return {
            "counts": counts,
            "reports": reports,
            "faults": faults,
            "status": status,
            "s": time.perf_counter() - t0,
        }

    async def run_due(self, now_ms: int | None = None) -> None:
        """Analyse every super pod whose next period is due (the loop calls this; tests may too)."""
        now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        for spid, pod in list(self.pods.items()):
            act = self.activation(spid)
            pod.active = bool(act and act.activate)
            if not pod.active:
                pod.faults = []  # pingmesh off: nothing is measured, nothing stays raised
                continue
            p_ms = pod.analyzer.params.period_ms
            latest = (now_ms - int(self.grace_s(spid) * 1000)) // p_ms - 1
            if pod.last_period is not None and latest <= pod.last_period:
                continue
            start = (
                latest
                if pod.last_period is None
                else max(pod.last_period + 1, latest - pod.analyzer.params.periods + 1)
            )
            periods = list(range(start, latest + 1))
            rows, pod.pending = pod.pending, []
            out = await self._in_thread(
                f"analysis:{spid}", self._analyze_blocking, pod, rows, periods, now_ms
            )
            pod.last_period = latest
            if pod.first_period is None:
                pod.first_period = latest
            pod.status = out["status"]
            pod.faults = out["faults"]
            pod.last_analysis_ms = now_ms
            pod.analysis_s = out["s"]
            self.m_time.observe(out["s"])
            for k, v in out["counts"].items():
                self.m_rows.labels(k).inc(v)
            for rep in out["reports"]:
                for a in rep.emitted:
                    event(log, logging.WARNING, "slow network alarm", super_pod=spid, kind=a.kind,
                          node=a.node, phy=a.phy, peer=f"{a.peer_node}/{a.peer_phy}" if a.peer_node else "",
                          plane=a.plane, fault_type=a.fault_type, alarm_level=a.level, loss=round(a.avg_loss, 1),
                          delay=a.avg_delay, paths=len(a.paths))  # fmt: skip
                for ident in rep.recovered:
                    event(log, logging.INFO, "slow network alarm recovered", super_pod=spid, alarm=ident)
            self.m_alarms.labels(spid).set(
                len(out["status"]["alarms"]) + len(out["status"]["unreachableCards"])
            )
            if out["reports"]:
                self.m_faulty.labels(spid).set(out["reports"][-1].faulty_paths)
        await self._sync_faults()
        if self.kube is not None:
            await self.kube.sync_faults(self.current)

    async def _sync_faults(self) -> None:
        desired: dict[FaultKey, Fault] = {}
        warm = {}
        for spid, pod in self.pods.items():
            for f in pod.faults:
                desired[f.key] = f
            p = pod.analyzer.params
            warm[spid] = not pod.active or (
                pod.first_period is not None
                and pod.last_period - pod.first_period >= p.min_baseline + p.recover_periods
            )
        upserts = [
            f for k, f in desired.items() if k not in self.current or not self.current[k].same_content(f)
        ]
        removals = []
        for k, f in self.current.items():
            if k in desired:
                continue
            spid = f.attributes.get("superPodId", "")
            if k in self._restored and not warm.get(spid, False) and spid in self.pods:
                continue  # restored at start: wait until the analysis could have re-found it
            removals.append(k)
        if not upserts and not removals:
            return
        await self.ctx.center.apply(upserts, removals, origin=SOURCE)
        for f in upserts:
            if f.key not in self.current:
                event(log, logging.WARNING, "slow network fault raised", node=f.node, device_type=f.device_type,
                      device_id=f.device_id, code=f.code, fault_level=f.level)  # fmt: skip
            self.current[f.key] = f
        for k in removals:
            self.current.pop(k, None)
            self._restored.discard(k)
            event(log, logging.INFO, "slow network fault recovered", node=k.node, device_type=k.device_type,
                  device_id=k.device_id, code=k.code)  # fmt: skip

    async def _in_thread(self, name: str, fn, *args):
        """Run blocking ``fn`` in a worker thread, at most one per ``name`` at a time, waiting at most
        ``ANALYSIS_TIMEOUT_S``. Raises ``TimeoutError`` (the thread finishes on its own and the next
        call of that name waits for it: state is never touched by two threads)."""
        prev = self._workers.get(name)
        if prev is not None and not prev.done():
            raise TimeoutError(f"{name}: the previous run is still going")
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._workers[name] = fut
        try:
            return await wait_for(asyncio.shield(fut), ANALYSIS_TIMEOUT_S)
        except TimeoutError:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            event(log, logging.ERROR, "slownet worker timed out", work=name, timeout_s=ANALYSIS_TIMEOUT_S)
            raise

    async def _loop(self) -> None:
        next_poll = time.monotonic() + self.args.slownet_file_poll_s
        while True:
            try:
                if time.monotonic() >= next_poll:
                    await self._poll_files()
                    next_poll = time.monotonic() + self.args.slownet_file_poll_s
                await self._poll_csv()
                await self.run_due()
            except Exception as e:  # one bad round must not end the component
                event(log, logging.ERROR, "slownet round failed", error=repr(e))
            await asyncio.sleep(TICK_S)
