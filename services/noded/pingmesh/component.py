"""noded's pingmesh source: HCCS pingmesh tasks through DCMI hccsping (or the fabric simulator),
result files, and result rows streamed to ClusterD.

Source: reference noded.md §6. Inputs, each from a file (re-read when it changes, every
``--pingmesh-file-poll-s``) or pushed by ClusterD over the agent stream (control kinds
``pingmesh_config``, ``topology``, ``ping_list``); the latest one wins, and an invalid one is
rejected (the control message is acked with the error) while the previous one stays:

- pingmesh-config (``--pingmesh-config-file``; :mod:`fdol.slownet.config`): the super pod's entry,
  else ``global``;
- the super-pod topology (``--pingmesh-topology-file``, reference ``superPodDevice`` JSON); it must be
  this node's super pod and hold this node;
- the ping list (``--pingmesh-ping-list-file``, else ``<net-root>/cluster/super-pod-<id>/
  ping_list_<serverIndex>.json`` when present; reference format).

Tasks: :func:`noded.pingmesh.plan.compute_plan` (per chip, task 0 for the destinations on the same
server, task 1 for the others, at most 48 each; the rest is dropped and counted); its job uid
identifies the plan: an unchanged uid restarts nothing. On a new plan the previous
tasks are stopped (the first time: tasks 0 and 1 of every chip) and, when ``activate`` is on, the
new ones started (packet size 1792, 10 packets, 10 ms apart, timeout 1, task_interval from the
config). Every ``10 x task_interval`` s (``--pingmesh-collect-interval-s`` overrides) each task's state
and info are read; a stopped task with no destinations (a chip reset) is restarted and that sample
skipped. Rows go to ``<node>.log``, ``ping_result_<serverIndex>.csv`` and ClusterD
(:mod:`noded.pingmesh.results`). All DCMI calls and file writes run in the bounded pool (``ctx.run_blocking``).
The input files are read by :class:`noded.pingmesh.inputs.InputFiles`, the RoCE plane between super
pods is probed by the owned :class:`noded.pingmesh.roceping.RoceRounds`.

Backends (``--pingmesh-backend``): ``dcmi`` (ctypes, ``--pingmesh-dcmi-lib``), ``sim`` (the fabric
simulator of ``--pingmesh-fabric FILE``, this node = ``--pingmesh-fabric-node`` or the node name),
``auto`` (dcmi when the library loads and supports hccsping, else off), ``off``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from typing import Any

from prometheus_client import Counter, Gauge

from faultmesh._pb import agent_pb2
from faultmesh.config import load_document
from faultmesh.dcmi.hccsping import STATE_STOPPED, ChipInfo, HccspingParamError, PingOp
from faultmesh.httplite import Request, Response, json_response
from faultmesh.log import RateLimitedLog, event
from faultmesh.runtime import wait_for
from faultmesh.source import PushSource, SourceContext
from fdol.slownet import config as pmconfig
from fdol.slownet import pinglist as pl
from fdol.slownet import topology as topo
from noded.pingmesh import wire
from noded.pingmesh.inputs import InputFiles
from noded.pingmesh.plan import compute_plan, valid_addr
from noded.pingmesh.results import ResultWriter, TaskSample, rows_from_samples
from noded.pingmesh.roceping import ROCE, RocePinger, RoceRounds
from noded.sections import PingmeshConfig

log = logging.getLogger("noded.pingmesh")

CALL_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0  # stopping the hccsping tasks at shutdown


class Pingmesh(PushSource):
    """The pingmesh source (module doc); fed by hccsping collections, file changes and control
    messages. Build with :meth:`from_config`, then ``await start(ctx)``. Owns the RoCE rounds
    (``roce_rounds``, from start) and their pinger (``roce``)."""

    name = "pingmesh"
    Config = PingmeshConfig  # its section (noded.sources.config_section)
    control_kinds = ("pingmesh_config", "topology", "ping_list")

    @staticmethod
    def add_arguments(parser) -> None:
        """Flags ``--pingmesh-*`` and ``--pingmesh-result-max-age-days``."""
        g = parser.add_argument_group("pingmesh")
        g.add_argument("--pingmesh-backend", choices=("auto", "dcmi", "sim", "off"), default="auto")
        g.add_argument("--pingmesh-dcmi-lib", help="path of libdcmi.so (default: the driver's dirs)")
        g.add_argument("--pingmesh-fabric", help="fabric simulator file (backend sim)")
        g.add_argument(
            "--pingmesh-fabric-node", help="this node's name in the fabric file (default: node name)"
        )
        g.add_argument(
            "--pingmesh-dir", default="/user/mind-cluster/pingmesh", help="folder of <nodename>.log"
        )
        g.add_argument(
            "--pingmesh-net-root",
            help="RAS net root holding cluster/super-pod-<id>/ (default: --pingmesh-dir)",
        )
        g.add_argument("--pingmesh-config-file", help="pingmesh-config (ConfigMap YAML or JSON)")
        g.add_argument("--pingmesh-topology-file", help="super-pod-<id> topology JSON")
        g.add_argument("--pingmesh-ping-list-file", help="ping_list_<serverIndex>.json")
        g.add_argument("--pingmesh-collect-interval-s", type=float, default=0.0,
                       help="collection interval (s); 0 = 10 x task_interval")  # fmt: skip
        g.add_argument(
            "--pingmesh-file-poll-s", type=float, default=10.0, help="input file poll interval (s)"
        )
        g.add_argument(
            "--pingmesh-result-max-age-days", type=float, default=7.0, help="result file retention (days)"
        )
        g.add_argument("--pingmesh-roce-fabric", help="simulated RoCE plane file (noded.pingmesh.rocefabric)")

    @classmethod
    def from_config(cls, cfg: PingmeshConfig, metrics=None) -> Pingmesh:
        """The source for its flag section ``cfg`` (``metrics``: unused, its own are on ctx.registry)."""
        return cls(cfg)

    def __init__(self, config: PingmeshConfig) -> None:
        super().__init__()
        self.cfg = config
        self.node = ""  # set by start(): --pingmesh-fabric-node or the node name
        self.backend = None
        self.backend_name = "off"
        self.chips: dict[int, ChipInfo] = {}
        self.super_pod_id: str | None = None
        self.server_index: int | None = None
        self.config: dict[str, pmconfig.Activation] | None = None
        self.topology: topo.SuperPod | None = None
        self.ping_list: dict[int, list[str]] | None = None
        self.ping_list_uid = ""
        self.plan: dict[tuple[int, int], tuple[str, ...]] = {}
        self.plan_uid = ""
        self.activation: pmconfig.Activation | None = None
        self._first_stop = True
        self._changed = asyncio.Event()
        self._hccs = asyncio.Lock()  # one plan change or collection at a time on the hccsping tasks
        self._files = InputFiles(config)
        self.last_collect_ms = 0
        self.rows_sent = 0
        self._ratelog = RateLimitedLog(log)
        self.roce: RocePinger | None = None  # the RoCE plane between super pods (noded.pingmesh.roceping)
        self.roce_rounds: RoceRounds | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self, ctx: SourceContext) -> None:
        """Take the context (metrics, route ``GET /v1/pingmesh``, control kinds), open the backend,
        read the chips and input files, start the pingmesh loop."""
        await super().start(ctx)
        self.node = self.cfg.pingmesh_fabric_node or ctx.node
        net_root = self.cfg.pingmesh_net_root or self.cfg.pingmesh_dir
        self.writer = ResultWriter(
            self.node, self.cfg.pingmesh_dir, net_root, self.cfg.pingmesh_result_max_age_days
        )
        reg = ctx.registry
        self.m_rows = Counter("faultmesh_pingmesh_rows_total", "pingmesh result rows produced", registry=reg)
        self.m_errors = Counter(
            "faultmesh_pingmesh_errors_total", "pingmesh failures by reason", ["reason"], registry=reg
        )
        self.m_tasks = Gauge("faultmesh_pingmesh_tasks", "hccsping tasks in the current plan", registry=reg)
        self.m_restarts = Counter(
            "faultmesh_pingmesh_task_restarts_total", "stopped tasks restarted (chip reset)", registry=reg
        )
        self.roce = RocePinger(self.node, self.cfg.pingmesh_roce_fabric)
        self.roce_rounds = RoceRounds(
            self.roce,
            self.cfg,
            ctx.run_blocking,
            self.writer.write_csv,
            self._emit,
            self.m_errors,
            self._ratelog,
        )
        ctx.add_route("GET", "/v1/pingmesh", self._http_status)
        for kind in self.control_kinds:
            ctx.on_control(kind, self.on_control)
        try:
            await self._open_backend()
        except Exception as e:
            self.m_errors.labels("backend").inc()
            event(log, logging.WARNING, "pingmesh disabled", backend=self.cfg.pingmesh_backend, error=str(e))
            self.backend = None
            self.backend_name = "off"
        await self._poll_files()
        ctx.spawn(self._loop(), name="pingmesh")

    async def stop(self) -> None:
        """Cancel the loop, then stop the running hccsping tasks (best effort, at most
        ``STOP_TIMEOUT_S``; noded's stop budget bounds it further)."""
        await super().stop()
        if self.backend is not None and self.plan and self.ctx is not None:
            with contextlib.suppress(Exception):
                await self.ctx.run_blocking(STOP_TIMEOUT_S, self._stop_tasks, list(self.plan))

    async def _open_backend(self) -> None:
        kind = self.cfg.pingmesh_backend
        if kind == "off":
            return
        if kind == "sim":
            if not self.cfg.pingmesh_fabric:
                raise ValueError("--pingmesh-backend sim needs --pingmesh-fabric FILE")
            from noded.pingmesh.fabric import Fabric
            from noded.pingmesh.simbackend import SimHccsping

            fabric = await self.ctx.run_blocking(CALL_TIMEOUT_S, Fabric.from_file, self.cfg.pingmesh_fabric)
            backend = SimHccsping(fabric, self.node)
        else:
            from faultmesh.dcmi.hccsping import DcmiHccsping

            backend = await self.ctx.run_blocking(
                CALL_TIMEOUT_S, DcmiHccsping.open, self.cfg.pingmesh_dcmi_lib
            )
            if not await self.ctx.run_blocking(CALL_TIMEOUT_S, backend.supported):
                raise RuntimeError("hccsping not supported by this driver")
        chips = await self.ctx.run_blocking(CALL_TIMEOUT_S, backend.chips)
        self.backend = backend
        self.backend_name = kind if kind != "auto" else "dcmi"
        self.chips = {c.phy_id: c for c in chips}
        for c in chips:
            if c.super_pod_id >= 0 and self.super_pod_id is None:
                self.super_pod_id = str(c.super_pod_id)
            if c.server_index >= 0 and self.server_index is None:
                self.server_index = c.server_index
        event(log, logging.INFO, "pingmesh backend ready", backend=self.backend_name, chips=len(chips),
              super_pod=self.super_pod_id, server_index=self.server_index)  # fmt: skip

    # -- inputs ----------------------------------------------------------------------------------
    async def on_control(self, msg: agent_pb2.ControlMessage) -> None:
        """Apply a pushed config / topology / ping list. Raises ``ValueError`` (acked as the error)
        for an invalid one; the previous one stays."""
        kind = msg.WhichOneof("body")
        try:
            if kind == "pingmesh_config":
                self.set_config(wire.config_from_pb(msg.pingmesh_config), "clusterd")
            elif kind == "topology":
                self.set_topology(wire.topology_from_pb(msg.topology), "clusterd")
            elif kind == "ping_list":
                self.set_ping_list_pb(msg.ping_list)
            else:
                raise ValueError(f"pingmesh does not handle {kind}")
        except ValueError as e:
            self.m_errors.labels(f"bad_{kind}").inc()
            event(log, logging.WARNING, "pingmesh input rejected", kind=kind, error=str(e))
            raise

    def set_config(self, cfg: dict[str, pmconfig.Activation], origin: str) -> None:
        """Use a parsed pingmesh-config."""
        self.config = cfg
        event(log, logging.INFO, "pingmesh config applied", origin=origin, keys=",".join(sorted(cfg)))
        self._changed.set()

    def set_topology(self, sp: topo.SuperPod, origin: str) -> None:
        """Use a super-pod topology. Raises ``ValueError`` when it is another super pod or lacks this node."""
        if self.super_pod_id is not None and sp.super_pod_id != self.super_pod_id:
            raise ValueError(f"topology of super pod {sp.super_pod_id}; this node is in {self.super_pod_id}")
        if self.node not in sp.nodes:
            raise ValueError(f"topology of super pod {sp.super_pod_id} does not list node {self.node}")
        self.topology = sp
        if self.super_pod_id is None:
            self.super_pod_id = sp.super_pod_id
        if self.server_index is None:
            self.server_index = sp.nodes[self.node].server_index
        event(log, logging.INFO, "pingmesh topology applied", origin=origin, super_pod=sp.super_pod_id,
              nodes=len(sp.nodes))  # fmt: skip
        self._changed.set()

    def set_ping_list_pb(self, m: agent_pb2.PingList) -> None:
        """Use a pushed ping list (``super_pod_id`` ``roce``: the RoCE plane's). Raises ``ValueError``
        for another super pod or a bad address."""
        if m.super_pod_id == ROCE:
            self.roce.set_list(m)
            if self.roce.dropped:
                self.m_errors.labels("too_many_destinations").inc(self.roce.dropped)
            return
        if self.super_pod_id is not None and m.super_pod_id and m.super_pod_id != self.super_pod_id:
            raise ValueError(f"ping list of super pod {m.super_pod_id}; this node is in {self.super_pod_id}")
        out: dict[int, set[str]] = {}
        for t in m.tasks:
            bad = [a for a in t.dst_addrs if not valid_addr(a)]
            if bad:
                raise ValueError(f"bad destination address {bad[0]!r} for phy {t.src_phy_id}")
            out.setdefault(t.src_phy_id, set()).update(t.dst_addrs)
        self._set_ping_list({k: sorted(v) for k, v in out.items()}, m.uid, "clusterd")

    def _set_ping_list(self, lst: dict[int, list[str]], uid: str, origin: str) -> None:
        self.ping_list = lst
        self.ping_list_uid = uid or hashlib.sha256(json.dumps(lst, sort_keys=True).encode()).hexdigest()
        event(log, logging.INFO, "pingmesh ping list applied", origin=origin, sources=len(lst),
              paths=sum(len(v) for v in lst.values()))  # fmt: skip
        self._changed.set()

    async def _poll_files(self) -> None:
        """Re-read input files that changed (read in the BlockingPool). Bad files are logged, counted
        and ignored."""
        scan = self._files.scan
        for kind, path, data in await self.ctx.run_blocking(
            CALL_TIMEOUT_S, scan, self.super_pod_id, self.server_index
        ):
            try:
                if isinstance(data, Exception):
                    raise data
                if kind == "config":
                    self.set_config(pmconfig.parse_config(load_document(data)), f"file:{path}")
                elif kind == "topology":
                    self.set_topology(topo.parse_super_pod(data), f"file:{path}")
                else:
                    lst = pl.parse_reference_json(data)
                    if any(not valid_addr(x) for v in lst.values() for x in v):
                        raise ValueError("bad destination address")
                    self._set_ping_list(lst, "", f"file:{path}")
            except (OSError, ValueError) as e:
                self.m_errors.labels(f"bad_{kind}_file").inc()
                event(log, logging.WARNING, "pingmesh input rejected", kind=kind, file=path, error=str(e))

    # -- plan ------------------------------------------------------------------------------------
    def compute_plan(self) -> tuple[dict[tuple[int, int], tuple[str, ...]], str, pmconfig.Activation | None]:
        """(tasks {(phy, task id): destinations}, job uid, activation) from the current inputs
        (:func:`noded.pingmesh.plan.compute_plan`; a cut task group is counted)."""
        p = compute_plan(self.config, self.topology, self.ping_list, self.super_pod_id, self.node, self.chips)
        if p.cut:
            self.m_errors.labels("too_many_destinations").inc(p.cut)
        return p.tasks, p.uid, p.activation

    def _stop_tasks(self, keys: list[tuple[int, int]]) -> None:
        for phy, task in keys:
            try:
                self.backend.stop(phy, task)
            except Exception as e:  # stopping what is not running is fine
                self._ratelog.warning("stop", "hccsping stop failed", phy=phy, task=task, error=str(e))

    def _apply_plan(self, plan, act: pmconfig.Activation | None) -> int:
        """Blocking: stop the previous tasks and start ``plan``. Returns tasks started."""
        if self._first_stop:
            old = [(p, t) for p in self.chips for t in (0, 1)]
            self._first_stop = False
        else:
            old = list(self.plan)
        self._stop_tasks(old)
        started = 0
        if act is None or not act.activate:
            return 0
        for (phy, task), dsts in sorted(plan.items()):
            try:
                self.backend.start(phy, PingOp(dsts, task_id=task, task_interval=act.task_interval))
                started += 1
            except (HccspingParamError, ValueError) as e:
                self.m_errors.labels("bad_task").inc()
                event(log, logging.WARNING, "hccsping task rejected", phy=phy, task=task, error=str(e))
            except Exception as e:
                self.m_errors.labels("start").inc()
                event(log, logging.WARNING, "hccsping start failed", phy=phy, task=task, error=str(e))
        return started

    async def _reconcile(self) -> None:
        async with self._hccs:  # two concurrent applies would start every task twice
            plan, uid, act = self.compute_plan()
            if uid == self.plan_uid and act == self.activation:
                return
            started = await self.ctx.run_blocking(CALL_TIMEOUT_S * 2, self._apply_plan, plan, act)
            self.plan, self.plan_uid, self.activation = plan, uid, act
        self.m_tasks.set(started)
        event(log, logging.INFO, "pingmesh plan applied", uid=uid[:16], tasks=started,
              activate=bool(act and act.activate), task_interval=act.task_interval if act else 0)  # fmt: skip

    # -- collection ------------------------------------------------------------------------------
    def _collect_blocking(self) -> list[agent_pb2.PingResult]:
        samples: list[TaskSample] = []
        act = self.activation
        for (phy, task), dsts in sorted(self.plan.items()):
            try:
                state = self.backend.state(phy, task)
                info = self.backend.info(phy, task)
            except Exception as e:
                self.m_errors.labels("collect").inc()
                self._ratelog.warning("collect", "hccsping query failed", phy=phy, task=task, error=str(e))
                continue
            if info.dest_num == 0 and state == STATE_STOPPED:
                try:
                    self.backend.start(phy, PingOp(dsts, task_id=task, task_interval=act.task_interval))
                    self.m_restarts.inc()
                    event(log, logging.INFO, "hccsping task restarted", phy=phy, task=task)
                except Exception as e:
                    self.m_errors.labels("restart").inc()
                    self._ratelog.warning(
                        "restart", "hccsping restart failed", phy=phy, task=task, error=str(e)
                    )
                continue
            samples.append(TaskSample(phy, self.topology.nodes[self.node].devices[phy], task, info))
        allowed = {phy: set(self.ping_list.get(phy, ())) for phy in self.chips}
        now_ms = time.time_ns() // 1_000_000
        rows, skipped = rows_from_samples(samples, allowed, self.super_pod_id, now_ms)
        if skipped:
            self.m_errors.labels("destination_not_in_ping_list").inc(skipped)
        try:
            self.writer.write_round(self.plan_uid, act.go_repr(), samples, allowed)
            self.writer.write_csv(self.super_pod_id, self.server_index, rows)
        except OSError as e:
            self.m_errors.labels("result_file").inc()
            self._ratelog.warning("result_file", "pingmesh result file not written", error=str(e))
        return rows

    async def collect_once(self) -> int:
        """One collection round (tests call it directly). Returns rows produced."""
        if self.backend is None or not self.plan or not (self.activation and self.activation.activate):
            return 0
        async with self._hccs:
            rows = await self.ctx.run_blocking(CALL_TIMEOUT_S * 2, self._collect_blocking)
        self.last_collect_ms = time.time_ns() // 1_000_000
        if rows:
            self._emit(rows)
        return len(rows)

    def _emit(self, rows: list[agent_pb2.PingResult]) -> None:
        """Hand result rows to the agent state (streamed to ClusterD), counted."""
        self.ctx.state.add_ping_results(rows)
        self.m_rows.inc(len(rows))
        self.rows_sent += len(rows)

    async def collect_roce(self) -> int:
        """One RoCE collection (tests call it directly; :class:`RoceRounds`). Returns rows produced."""
        if self.roce_rounds is None:
            return 0
        return await self.roce_rounds.collect(self.config, self.super_pod_id, self.server_index)

    def _roce_interval(self) -> float:
        return self.roce_rounds.interval(self.config) if self.roce_rounds else self._interval()

    def _interval(self) -> float:
        if self.cfg.pingmesh_collect_interval_s > 0:
            return self.cfg.pingmesh_collect_interval_s
        return float(self.activation.period_s) if self.activation else self.cfg.pingmesh_file_poll_s

    async def _loop(self) -> None:
        next_poll = time.monotonic() + self.cfg.pingmesh_file_poll_s
        next_collect = time.monotonic() + self._interval()
        next_roce = time.monotonic() + self._roce_interval()
        retry_at: float | None = None
        while True:
            now = time.monotonic()
            if now >= next_roce:
                next_roce = now + self._roce_interval()
                try:
                    await self.collect_roce()
                except Exception as e:  # a failing RoCE round must not end pingmesh
                    self.m_errors.labels("roce_round").inc()
                    self._ratelog.warning("roce_round", "pingmesh roce round failed", error=repr(e))
            if now >= next_poll:
                next_poll = now + self.cfg.pingmesh_file_poll_s
                try:
                    await self._poll_files()
                except Exception as e:  # e.g. a hung file system: try again next poll
                    self.m_errors.labels("file_poll").inc()
                    self._ratelog.warning("file_poll", "pingmesh input files not read", error=repr(e))
            changed = self._changed.is_set() or (retry_at is not None and now >= retry_at)
            self._changed.clear()
            if self.backend is not None:
                try:
                    if changed:
                        retry_at = now + 5.0  # cleared below once the plan is applied
                        await self._reconcile()
                        retry_at = None
                        next_collect = time.monotonic() + self._interval()
                    if time.monotonic() >= next_collect:
                        await self.collect_once()
                        next_collect = time.monotonic() + self._interval()
                except Exception as e:  # a failing round must not end pingmesh
                    self.m_errors.labels("round").inc()
                    event(log, logging.ERROR, "pingmesh round failed", error=repr(e))
                    next_collect = time.monotonic() + self._interval()
            collect_at = next_collect if self.backend is not None else next_poll  # none: never due (it
            # stayed in the past and woke the loop every 50 ms: 0.2 % of a core idle, issue 18)
            due = min(next_poll, collect_at, next_roce, retry_at if retry_at is not None else next_poll)
            wait = max(0.05, due - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await wait_for(self._changed.wait(), wait)

    # -- HTTP ------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """This node's pingmesh state (for ``GET /v1/pingmesh`` on noded)."""
        act = self.activation
        return {
            "node": self.node,
            "backend": self.backend_name,
            "superPodId": self.super_pod_id,
            "serverIndex": self.server_index,
            "chips": sorted(self.chips),
            "activate": bool(act and act.activate),
            "taskInterval": act.task_interval if act else None,
            "uid": self.plan_uid,
            "tasks": [
                {"phyId": p, "taskId": t, "destinations": list(d)} for (p, t), d in sorted(self.plan.items())
            ],
            "lastCollectMs": self.last_collect_ms,
            "rowsSent": self.rows_sent,
            "haveConfig": self.config is not None,
            "haveTopology": self.topology is not None,
            "havePingList": self.ping_list is not None,
            "roce": self.roce.status() if self.roce else {},
        }

    async def _http_status(self, request: Request) -> Response:
        return json_response(self.status())
