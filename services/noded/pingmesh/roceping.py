"""noded's RoCE pings: the parameter plane between super pods (issue 16; reference noded.md §6 "RoCE
ICMP pings between super pods are done in user space", ``component/noded/pkg/pingmesh/roceping``).

ClusterD pushes a ``PingList`` with ``super_pod_id`` ``roce`` to the nodes that probe the plane
(:mod:`fdol.slownet.roce`): source phy -> destination IPs, at most ``MAX_ITEMS`` (16) items, the
rest dropped and counted. When pingmesh-config's ``roce`` entry is on, every ``10 x task_interval``
s (``--pingmesh-collect-interval-s`` overrides) each destination is pinged ``PACKETS_PER_ROUND``
(10) times per task_interval and one row per destination (``super_pod_id`` ``roce``, IP addresses,
task 0, delays in µs, -1 when nothing answered) goes to ClusterD and to
``<net-root>/cluster/super-pod-roce/ping_result_<spid>_<serverIndex>.csv``.

Backends: ``--pingmesh-roce-fabric FILE`` (the simulated plane, :mod:`noded.pingmesh.rocefabric`,
re-read when the file changes). There is no ICMP backend yet: raw ICMP sockets need CAP_NET_RAW and
the NPU's RoCE port (A2: ``hccn_tool -ping``), neither on this project's test machines; without a
fabric the RoCE list is kept and nothing is probed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultmesh._pb import agent_pb2
from faultmesh.files import FileWatch
from faultmesh.log import event
from fdol.slownet import config as pmconfig

if TYPE_CHECKING:
    from prometheus_client import Counter

    from faultmesh.log import RateLimitedLog
    from noded.pingmesh.rocefabric import RoceFabric
    from noded.sections import PingmeshConfig

log = logging.getLogger("noded.pingmesh")

MAX_ITEMS = 16
PACKETS_PER_ROUND = 10
ROCE = "roce"  # the RoCE plane's super pod id and pingmesh-config key
PERIOD_ROUNDS = 10  # probe rounds per collection (one per task_interval)
ROCE_CALL_TIMEOUT_S = 30.0


class RocePinger:
    """The RoCE side of one noded (module doc). Blocking methods run in the bounded pool."""

    def __init__(self, node: str, fabric_file: str | None) -> None:
        self.node = node
        self.fabric_file = fabric_file
        self.fabric: RoceFabric | None = None
        self._watch = FileWatch(fabric_file) if fabric_file else None
        self.tasks: dict[int, list[str]] = {}
        self.uid = ""
        self.dropped = 0

    def set_list(self, m: agent_pb2.PingList) -> None:
        """Use a pushed RoCE ping list. Raises ``ValueError`` for a destination that is not an IPv4
        address; more than ``MAX_ITEMS`` items are cut (``dropped`` counts them)."""
        tasks: dict[int, list[str]] = {}
        n = 0
        for t in m.tasks:
            for ip in t.dst_addrs:
                parts = ip.split(".")
                if len(parts) != 4 or not all(p.isdigit() and int(p) <= 255 for p in parts):
                    raise ValueError(f"RoCE destination {ip!r} is not an IPv4 address")
                if n < MAX_ITEMS:
                    tasks.setdefault(t.src_phy_id, []).append(ip)
                n += 1
        self.dropped = max(0, n - MAX_ITEMS)
        self.tasks, self.uid = tasks, m.uid
        event(log, logging.INFO, "pingmesh roce list applied", paths=min(n, MAX_ITEMS), dropped=self.dropped)

    def _load(self) -> RoceFabric | None:
        if self._watch is not None and self._watch.changed() and Path(self.fabric_file).exists():
            # the simulated plane (numpy) is imported only where it is configured (issue 18: lean agents)
            from noded.pingmesh.fabric import FabricError, read_spec
            from noded.pingmesh.rocefabric import RoceFabric

            try:
                self.fabric = RoceFabric(read_spec(self.fabric_file))
            except FabricError as e:
                event(log, logging.WARNING, "roce fabric file rejected", file=self.fabric_file, error=str(e))
        return self.fabric

    def status(self) -> dict:
        """The RoCE part of noded's ``GET /v1/pingmesh``."""
        return {"ip": self.own_ip(), "destinations": {str(p): d for p, d in sorted(self.tasks.items())},
                "uid": self.uid}  # fmt: skip

    def own_ip(self) -> str | None:
        """This node's RoCE IP (from the backend), None when unknown."""
        fab = self.fabric
        return fab.nodes[self.node][2] if fab is not None and self.node in fab.nodes else None

    def collect(self, rounds: int) -> list[agent_pb2.PingResult]:
        """Blocking: one collection of ``rounds`` rounds over the list -> rows (module doc)."""
        fab = self._load()
        me = self.own_ip()
        if fab is None or me is None or not self.tasks:
            return []
        items = [(phy, ip) for phy, ips in sorted(self.tasks.items()) for ip in ips]
        packets = max(1, rounds) * PACKETS_PER_ROUND
        suc, fail, avg = fab.probe_many([(self.node, ip) for _, ip in items], packets)
        now_ms = time.time_ns() // 1_000_000
        rows = []
        for (phy, ip), s, f, a in zip(items, suc.tolist(), fail.tolist(), avg.tolist(), strict=True):
            loss = round(f / (s + f), 3) if s + f else 1.0
            d = float(round(a)) if s else -1.0
            rows.append(agent_pb2.PingResult(
                ping_task_id=0, src_type="0", src_addr=me, dst_type="0", dst_addr=ip, min_delay=d, max_delay=d,
                avg_delay=d, min_loss_rate=loss, max_loss_rate=loss, avg_loss_rate=loss, timestamp_ms=now_ms,
                super_pod_id="roce", src_phy_id=phy,
            ))  # fmt: skip
        return rows


class RoceRounds:
    """The RoCE collection rounds of the pingmesh source, which owns one: ``pinger`` probes (in the
    bounded pool, ``run_blocking``); ``write_csv(spid, server_index, rows, roce)``: the result
    writer's; ``emit(rows)`` hands the rows to the agent state; ``errors``: the pingmesh failure
    counter (``reason``), ``ratelog`` its rate-limited log; ``cfg``: the pingmesh section."""

    def __init__(
        self,
        pinger: RocePinger,
        cfg: PingmeshConfig,
        run_blocking: Callable[..., Awaitable[Any]],
        write_csv: Callable[..., Any],
        emit: Callable[[list[agent_pb2.PingResult]], None],
        errors: Counter,
        ratelog: RateLimitedLog,
    ) -> None:
        self.pinger = pinger
        self.cfg = cfg
        self._run_blocking = run_blocking
        self._write_csv = write_csv
        self._emit = emit
        self._errors = errors
        self._ratelog = ratelog

    async def collect(
        self,
        config: dict[str, pmconfig.Activation] | None,
        super_pod_id: str | None,
        server_index: int | None,
    ) -> int:
        """One RoCE collection under pingmesh-config ``config`` (nothing unless its ``roce`` entry is
        on); the CSV is written once the super pod and server index are known. Returns rows produced."""
        act = pmconfig.for_super_pod(config or {}, ROCE)
        if not (act and act.activate):
            return 0
        rows = await self._run_blocking(ROCE_CALL_TIMEOUT_S, self.pinger.collect, PERIOD_ROUNDS)
        if rows and super_pod_id is not None and server_index is not None:
            try:
                await self._run_blocking(
                    ROCE_CALL_TIMEOUT_S, self._write_csv, super_pod_id, server_index, rows, True
                )
            except OSError as e:
                self._errors.labels("result_file").inc()
                self._ratelog.warning("roce_file", "roce result file not written", error=str(e))
        if rows:
            self._emit(rows)
        return len(rows)

    def interval(self, config: dict[str, pmconfig.Activation] | None) -> float:
        """Seconds between RoCE collections: ``--pingmesh-collect-interval-s``, else the ``roce``
        entry's period, else the file poll interval."""
        if self.cfg.pingmesh_collect_interval_s > 0:
            return self.cfg.pingmesh_collect_interval_s
        act = pmconfig.for_super_pod(config or {}, ROCE)
        return float(act.period_s) if act else self.cfg.pingmesh_file_poll_s
