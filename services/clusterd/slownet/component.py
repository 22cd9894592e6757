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
  ``pingmesh-fault-<node>`` (:mod:`clusterd.slownet.kube`);
- the RoCE parameter plane between super pods, built from the topologies' ``RoceIP`` when the
  config has a ``roce`` entry (:mod:`clusterd.slownet.roce`).
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
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

from clusterd.detectors import fdol_edge as edge
from clusterd.detectors.fdol_edge import SOURCE
from clusterd.slownet.http import SlowNetHttp
from clusterd.slownet.inputs import InputFiles
from clusterd.slownet.kube import PingmeshConfigMaps
from clusterd.slownet.roce import rebuild_plane, roce_list_pb
from clusterd.slownet.state import AGENT, PodState, SlowNetConfig, SlowNetState
from faultmesh._pb import agent_pb2
from faultmesh.config import load_document
from faultmesh.log import event
from faultmesh.model import Fault, FaultKey
from faultmesh.runtime import wait_for
from fdol.slownet import config as pmconfig
from fdol.slownet import pinglist as pl
from fdol.slownet import roce
from fdol.slownet import topology as topo
from fdol.slownet.window import PingRow

if TYPE_CHECKING:
    from clusterd.context import ClusterContext
    from clusterd.kube.config import KubeConfig
    from clusterd.kube.leader import Election
    from clusterd.kube.metrics import KubeMetrics

log = logging.getLogger("clusterd.slownet")

NS = "slownet"
ANALYSIS_TIMEOUT_S = 60.0
TICK_S = 0.25


class SlowNetComponent:
    """The clusterd slow-network component (module doc): owns the :class:`SlowNetState`, the input
    files, the analysis loop and the fault records; the HTTP views
    (:class:`~clusterd.slownet.http.SlowNetHttp`) and the ConfigMaps
    (:class:`~clusterd.slownet.kube.PingmeshConfigMaps`) get only the callables they use."""

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

    def __init__(
        self,
        ctx: ClusterContext,
        cfg: SlowNetConfig,
        kube: KubeConfig | None = None,
        election: Election | None = None,
        kube_metrics: KubeMetrics | None = None,
    ) -> None:
        """``cfg``: its section; ``kube``: the Kubernetes mode's section (with ``--kube``, the
        pingmesh ConfigMaps are read and written; None: never), ``election``: the replica's Lease
        election (it gates the ConfigMap writes), ``kube_metrics``: the Kubernetes component's watch
        metrics."""
        self.ctx = ctx
        self.cfg = cfg
        self._kube = (kube, election, kube_metrics)  # for the ConfigMaps started with the component
        self.state = SlowNetState(cfg)
        self.current: dict[FaultKey, Fault] = {}
        self._restored: set[FaultKey] = set()
        self._files = InputFiles(cfg)
        self._workers: dict[str, asyncio.Future] = {}
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
        self.http = SlowNetHttp(
            self.state, ctx.agents.connected, self.set_topology, self.set_config, self.m_inputs
        )
        self.http.add_routes(ctx.http.app.router)

    # the state, as the Kubernetes control ConfigMaps and tests read it
    pods = property(lambda self: self.state.pods)
    config = property(lambda self: self.state.config)
    node_pod = property(lambda self: self.state.node_pod)
    roce_plane = property(lambda self: self.state.roce_plane)

    def activation(self, spid: str) -> pmconfig.Activation | None:
        """The pingmesh-config entry of a super pod (None: not configured)."""
        return self.state.activation(spid)

    def roce_list_pb(self, node: str):
        """The RoCE ``PingList`` of a probing node (None when it does not probe)."""
        return roce_list_pb(self.state, node)

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Restore stored inputs and faults, read input files, push lists, start the period loop."""
        stored = await self.ctx.store.kv_items(NS)
        if "config" in stored:
            with contextlib.suppress(ValueError):
                self.state.config = pmconfig.parse_config(stored["config"])
        for key, value in sorted(stored.items()):
            if key.startswith("topology:"):
                try:
                    self.state.install(topo.parse_super_pod(value))
                except ValueError as e:
                    event(log, logging.WARNING, "stored topology dropped", key=key, error=str(e))
        rebuild_plane(self.state)
        self.current = {f.key: f for f in self.ctx.center.faults() if f.source == SOURCE}
        self._restored = set(self.current)
        await self._poll_files()
        for spid in list(self.pods):
            await self._push_pod(spid)
        self.ctx.tasks.spawn(self._loop(), name="slownet")
        kube, election, kube_metrics = self._kube
        if kube is not None and kube.kube:  # the pingmesh control ConfigMaps (issue 15)
            self.kube = PingmeshConfigMaps(
                kube, self.ctx.tasks.spawn, self.set_config, self.set_topology, self.m_inputs,
                election, kube_metrics,
            )  # fmt: skip
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
    async def set_topology(self, sp: topo.SuperPod, origin: str) -> None:
        """Use a (validated) topology: store it, regenerate the ping lists, push them."""
        self.state.check_new_topology(sp)
        self.state.install(sp)
        rebuild_plane(self.state)
        await self.ctx.store.kv_put(NS, f"topology:{sp.super_pod_id}", sp.to_json_obj())
        event(log, logging.INFO, "slownet topology applied", origin=origin, super_pod=sp.super_pod_id,
              nodes=len(sp.nodes), npus=sp.npu_count, paths=len(self.pods[sp.super_pod_id].pairs))  # fmt: skip
        await self._push_pod(sp.super_pod_id)
        if roce.PLANE_ID in self.pods:
            await self._push_pod(roce.PLANE_ID)

    async def set_config(self, cfg: dict[str, pmconfig.Activation], origin: str) -> None:
        """Use a (validated) pingmesh-config: store it, rebuild analyzers whose period changed, push."""
        self.state.config = cfg
        await self.ctx.store.kv_put(NS, "config", pmconfig.to_json_obj(cfg))
        for spid, pod in self.pods.items():
            params = self.state.params(spid)
            if params.period_ms != pod.analyzer.params.period_ms:
                self.pods[spid] = PodState(pod.sp, pod.pairs, params)
                # a new window: keep this pod's faults until the analysis has warmed up again
                self._restored |= {
                    k for k, f in self.current.items() if f.attributes.get("superPodId") == spid
                }
        rebuild_plane(self.state)
        event(log, logging.INFO, "slownet config applied", origin=origin, keys=",".join(sorted(cfg)))
        for spid in list(self.pods):
            await self._push_pod(spid)

    async def _poll_csv(self) -> None:
        if not self.cfg.slownet_csv_root:
            return
        found = await self._in_thread("csv", self._files.scan_csv, sorted(self.pods))
        for spid, (rows, bad) in found.items():
            if bad:
                self.m_rows.labels("csv_bad_line").inc(bad)
            pod = self.pods.get(spid)
            if pod is not None and rows:
                plane = self.roce_plane if spid == roce.PLANE_ID else None
                pod.pending.extend(plane.to_plane_row(r.row()) if plane else r.row() for r in rows)

    async def _poll_files(self) -> None:
        cfg, topos = await self._in_thread("files", self._files.scan_files)
        if cfg is not None:
            path, text = cfg
            try:
                if isinstance(text, OSError):
                    raise text
                await self.set_config(pmconfig.parse_config(load_document(text)), f"file:{path}")
            except (OSError, ValueError) as e:
                self.m_inputs.labels("config").inc()
                event(log, logging.WARNING, "slownet input rejected", kind="config", file=path, error=str(e))
        for path, text in topos:
            try:
                if isinstance(text, OSError):
                    raise text
                await self.set_topology(topo.parse_super_pod(text), f"file:{path}")
            except (OSError, ValueError) as e:
                self.m_inputs.labels("topology").inc()
                event(
                    log, logging.WARNING, "slownet input rejected", kind="topology", file=path, error=str(e)
                )

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

    async def _push_roce(self, node: str) -> bool:
        m = self.roce_list_pb(node)
        if m is None:
            return True
        return await self.ctx.agents.send(node, AGENT, ping_list=m)

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
    def _analyze_blocking(self, pod: PodState, rows: list[PingRow], periods: list[int], now_ms: int) -> dict:
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
            act = self.state.activation(spid)
            pod.active = bool(act and act.activate)
            if not pod.active:
                pod.faults = []  # pingmesh off: nothing is measured, nothing stays raised
                continue
            p_ms = pod.analyzer.params.period_ms
            latest = (now_ms - int(self.state.grace_s(spid) * 1000)) // p_ms - 1
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
        next_poll = time.monotonic() + self.cfg.slownet_file_poll_s
        while True:
            try:
                if time.monotonic() >= next_poll:
                    await self._poll_files()
                    next_poll = time.monotonic() + self.cfg.slownet_file_poll_s
                await self._poll_csv()
                await self.run_due()
            except Exception as e:  # one bad round must not end the component
                event(log, logging.ERROR, "slownet round failed", error=repr(e))
            await asyncio.sleep(TICK_S)
