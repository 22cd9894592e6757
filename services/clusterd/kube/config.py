"""The configuration sections of clusterd's Kubernetes mode (issue 28; :func:`faultmesh.config.section`).

:class:`KubeConfig` is the section the Kubernetes component (:mod:`clusterd.kube.component`), its
publisher and the replica runner (:mod:`clusterd.kube.ha`) are built with; it holds the sections of
its parts: :class:`~clusterd.kube.leader.LeaderConfig` and :class:`~clusterd.kube.signals.SignalsConfig`.
The flags and their defaults are defined once, by ``KubeComponent.add_arguments``.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterd.kube.leader import LeaderConfig
from clusterd.kube.signals import SignalsConfig


@dataclass(frozen=True)
class KubeConfig:
    """Kubernetes mode: ``kube`` ``--kube`` (on at all); the API: ``kubeconfig`` ``--kubeconfig``,
    ``kube_api`` ``--kube-api`` (a URL without auth, overrides it), ``kube_timeout_s``
    ``--kube-timeout-s`` (one call, s), ``kube_watch_timeout_s`` ``--kube-watch-timeout-s``
    (server-side, s); namespaces: ``--kube-publish-namespace`` (cluster-info-*),
    ``--kube-deviceinfo-namespace``, ``--kube-nodeinfo-namespace``, ``--kube-publicfault-namespace``
    (empty: all), ``--kube-clusterd-config-namespace`` (clusterd-config-cm); publishing:
    ``kube_device_type`` ``--kube-device-type``, ``kube_shard_bytes`` ``--kube-shard-bytes``,
    ``kube_min_write_s`` ``--kube-min-write-s``, ``kube_resync_s`` ``--kube-resync-s``,
    ``kube_publish_holdoff_s`` ``--kube-publish-holdoff-s`` (-1: automatic,
    :func:`clusterd.kube.publisher.publish_holdoff_s`); jobs: ``kube_jobs`` ``--kube-jobs`` and
    ``kube_podgroups`` ``--kube-podgroups`` (``on`` / ``off``); the pingmesh topology:
    ``kube_superpod_period_s`` ``--kube-superpod-period-s`` (s); ``leader``: the leader election's
    section, ``signals``: the node signals'."""

    kube: bool
    kubeconfig: str | None
    kube_api: str | None
    kube_timeout_s: float
    kube_watch_timeout_s: int
    kube_publish_namespace: str
    kube_deviceinfo_namespace: str
    kube_nodeinfo_namespace: str
    kube_publicfault_namespace: str
    kube_clusterd_config_namespace: str
    kube_device_type: str
    kube_shard_bytes: int
    kube_min_write_s: float
    kube_resync_s: float
    kube_publish_holdoff_s: float
    kube_jobs: str
    kube_podgroups: str
    kube_superpod_period_s: float
    leader: LeaderConfig
    signals: SignalsConfig

    @property
    def leader_elect(self) -> bool:
        """True with ``--kube-leader-elect on``: only the Lease holder writes."""
        return self.leader.kube_leader_elect == "on"

    @property
    def replicated(self) -> bool:
        """True when this process runs as one of several replicas (``--kube --kube-leader-elect on``)."""
        return self.kube and self.leader_elect
