"""Slow-network detection: the state every part of the component reads (see :mod:`clusterd.slownet`):
the super pods (topology, ping list, analyzer, pending rows), the pingmesh-config, node -> super pod,
the RoCE plane, and the analysis parameters derived from the flags and the config.

Owned by :class:`clusterd.slownet.component.SlowNetComponent`; the HTTP views, the input files, the
RoCE plane and the ConfigMaps get it (or the few callables they need) explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clusterd.detectors import fdol_edge as edge
from faultmesh.model import Fault
from fdol.slownet import config as pmconfig
from fdol.slownet import pinglist as pl
from fdol.slownet import roce
from fdol.slownet import topology as topo
from fdol.slownet.analyzer import AnalyzerParams, SuperPodAnalyzer
from fdol.slownet.window import PingRow

AGENT = "noded"  # the agent that runs pingmesh


@dataclass(frozen=True)
class SlowNetConfig:
    """Slow-network detection's configuration section (:func:`faultmesh.config.section`): inputs
    ``slownet_topology`` ``--slownet-topology``, ``slownet_config`` ``--slownet-config``,
    ``slownet_csv_root`` ``--slownet-csv-root`` (None: not read), ``slownet_file_poll_s``
    ``--slownet-file-poll-s`` (s); the analysis: ``slownet_period_s`` ``--slownet-period-s`` (0: 10 x
    task_interval), ``slownet_grace_s`` ``--slownet-grace-s`` (-1: automatic),
    ``slownet_suppress_s`` ``--slownet-suppress-s``, ``slownet_intra`` ``--slownet-intra`` (``mesh``
    / ``ring``), ``slownet_loss_abs_pct`` ``--slownet-loss-abs-pct``, ``slownet_delay_abs``
    ``--slownet-delay-abs`` (0: off), ``slownet_min_baseline`` ``--slownet-min-baseline``,
    ``slownet_recover_periods`` ``--slownet-recover-periods``, ``slownet_stale_periods``
    ``--slownet-stale-periods``."""

    slownet_topology: str | None
    slownet_config: str | None
    slownet_csv_root: str | None
    slownet_file_poll_s: float
    slownet_period_s: float
    slownet_grace_s: float
    slownet_suppress_s: float
    slownet_intra: str
    slownet_loss_abs_pct: float
    slownet_delay_abs: float
    slownet_min_baseline: int
    slownet_recover_periods: int
    slownet_stale_periods: int


class PodState:
    """One super pod: topology ``sp``, ping ``pairs`` (and ``by_node``), its ``analyzer``, rows
    ``pending`` analysis, the periods analysed, the last status and faults."""

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

    def set_topology(self, sp: topo.SuperPod, pairs: list[pl.PingPair]) -> None:
        """Keep the analysis window, change the topology and ping list."""
        self.sp, self.pairs, self.by_node = sp, pairs, pl.by_node(pairs)
        self.analyzer.set_topology(sp, pairs)


class SlowNetState:
    """``pods`` (super pod id -> :class:`PodState`, the RoCE plane under ``roce``), ``config``
    (pingmesh-config entries), ``node_pod`` (node -> super pod id), ``roce_plane``; ``cfg``: the
    section of the ``--slownet-*`` flags."""

    def __init__(self, cfg: SlowNetConfig) -> None:
        self.cfg = cfg
        self.pods: dict[str, PodState] = {}
        self.config: dict[str, pmconfig.Activation] = {}
        self.node_pod: dict[str, str] = {}
        self.roce_plane: roce.RocePlane | None = None

    def activation(self, spid: str) -> pmconfig.Activation | None:
        """The pingmesh-config entry of a super pod (None: not configured)."""
        return pmconfig.for_super_pod(self.config, spid)

    def period_s(self, spid: str) -> float:
        """Detection period of a super pod (s)."""
        if self.cfg.slownet_period_s > 0:
            return self.cfg.slownet_period_s
        act = self.activation(spid)
        return float(act.period_s if act else 10)

    def grace_s(self, spid: str) -> float:
        """Wait after a period's end before analysing it (s)."""
        if self.cfg.slownet_grace_s >= 0:
            return self.cfg.slownet_grace_s
        return max(self.period_s(spid) / 2, 6.0)

    def params(self, spid: str) -> AnalyzerParams:
        """The analyzer parameters of a super pod (flags and its period)."""
        a = self.cfg
        return AnalyzerParams(
            period_ms=int(self.period_s(spid) * 1000),
            min_baseline=a.slownet_min_baseline,
            loss_abs_pct=a.slownet_loss_abs_pct if a.slownet_loss_abs_pct > 0 else None,
            delay_abs=a.slownet_delay_abs if a.slownet_delay_abs > 0 else None,
            recover_periods=a.slownet_recover_periods,
            stale_periods=a.slownet_stale_periods,
            suppress_s=a.slownet_suppress_s,
        )

    def install(self, sp: topo.SuperPod) -> PodState:
        """Add or update the super pod of topology ``sp`` (ping list regenerated, window kept)."""
        pairs = pl.generate(sp, intra=self.cfg.slownet_intra)
        pod = self.pods.get(sp.super_pod_id)
        if pod is None:
            pod = self.pods[sp.super_pod_id] = PodState(sp, pairs, self.params(sp.super_pod_id))
        else:
            pod.set_topology(sp, pairs)
        for node, spid in list(self.node_pod.items()):
            if spid == sp.super_pod_id and node not in sp.nodes:
                del self.node_pod[node]
        for node in sp.nodes:
            self.node_pod[node] = sp.super_pod_id
        return pod

    def check_new_topology(self, sp: topo.SuperPod) -> None:
        """Raises ``ValueError`` when ``sp`` may not be installed: the RoCE plane's id, or nodes of
        another super pod."""
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
