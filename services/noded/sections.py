"""The typed configuration sections of noded's sources (issue 28; :func:`faultmesh.config.section`).

Each source class names its section as ``Config``; :func:`noded.sources.config_section` builds it
once from the parsed command line and the source is built with it (``from_config``). The fields
are exactly the flags the source's ``add_arguments`` defines (their defaults live there, once);
``tests/noded/test_app.py`` checks every section against noded's parser.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BmcConfig:
    """The BMC source (:class:`noded.sources.bmc.Bmc`): the BMC ``bmc_host`` ``--bmc-host`` (None:
    no polling), ``bmc_port`` ``--bmc-port``, ``bmc_user`` ``--bmc-user``, ``bmc_password_file``
    ``--bmc-password-file``, ``bmc_mode`` ``--bmc-mode``; timing (s): ``bmc_timeout``
    ``--bmc-timeout``, ``poll_interval`` ``--poll-interval``, ``bmc_call_timeout_max``
    ``--bmc-call-timeout-max``, ``backoff_base`` ``--backoff-base``; tables and state:
    ``levels_file`` ``--levels-file``, ``levels_check_interval`` ``--levels-check-interval`` (s),
    ``sel_events_file`` ``--sel-events-file``, ``bmc_state_file`` ``--bmc-state-file``."""

    bmc_host: str | None
    bmc_port: int
    bmc_user: str
    bmc_password_file: str | None
    bmc_mode: str
    bmc_timeout: float
    poll_interval: float
    bmc_call_timeout_max: float
    backoff_base: float
    levels_file: str | None
    levels_check_interval: float
    sel_events_file: str | None
    bmc_state_file: str | None


@dataclass(frozen=True)
class StorageConfig:
    """The storage sources (:class:`noded.sources.storage.Dpc`, ``Dtfs``; one section for both):
    ``dpc_status_file`` ``--dpc-status-file``, ``dtfs_status_file`` ``--dtfs-status-file`` (None:
    off), ``storage_interval`` ``--storage-interval`` (s), ``storage_memory_hold_s``
    ``--storage-memory-hold-s`` (s)."""

    dpc_status_file: str | None
    dtfs_status_file: str | None
    storage_interval: float
    storage_memory_hold_s: float

    def status_file(self, kind: str) -> str:
        """The status file of source ``kind`` (``dpc`` / ``dtfs``; "" when not set). Raises
        ``ValueError`` for another kind."""
        files = {"dpc": self.dpc_status_file, "dtfs": self.dtfs_status_file}
        if kind not in files:
            raise ValueError(f"no storage source {kind!r} (dpc, dtfs)")
        return files[kind] or ""


@dataclass(frozen=True)
class PingmeshConfig:
    """The pingmesh source (:class:`noded.pingmesh.Pingmesh`): ``pingmesh_backend``
    ``--pingmesh-backend``, ``pingmesh_dcmi_lib`` ``--pingmesh-dcmi-lib``, ``pingmesh_fabric``
    ``--pingmesh-fabric``, ``pingmesh_fabric_node`` ``--pingmesh-fabric-node`` (None: the node
    name), ``pingmesh_roce_fabric`` ``--pingmesh-roce-fabric``; files: ``pingmesh_dir``
    ``--pingmesh-dir``, ``pingmesh_net_root`` ``--pingmesh-net-root``, ``pingmesh_config_file``
    ``--pingmesh-config-file``, ``pingmesh_topology_file`` ``--pingmesh-topology-file``,
    ``pingmesh_ping_list_file`` ``--pingmesh-ping-list-file``; timing:
    ``pingmesh_collect_interval_s`` ``--pingmesh-collect-interval-s``, ``pingmesh_file_poll_s``
    ``--pingmesh-file-poll-s`` (s), ``pingmesh_result_max_age_days``
    ``--pingmesh-result-max-age-days``."""

    pingmesh_backend: str
    pingmesh_dcmi_lib: str | None
    pingmesh_fabric: str | None
    pingmesh_fabric_node: str | None
    pingmesh_dir: str
    pingmesh_net_root: str | None
    pingmesh_config_file: str | None
    pingmesh_topology_file: str | None
    pingmesh_ping_list_file: str | None
    pingmesh_collect_interval_s: float
    pingmesh_file_poll_s: float
    pingmesh_result_max_age_days: float
    pingmesh_roce_fabric: str | None


@dataclass(frozen=True)
class SlowNodeConfig:
    """The slow-node source (:class:`noded.slownode.SlowNode`): ``profiling_dir``
    ``--profiling-dir``, ``slownode_data_trace_dir`` ``--slownode-data-trace-dir``,
    ``slownode_round_timeout`` ``--slownode-round-timeout`` (s)."""

    profiling_dir: str
    slownode_data_trace_dir: str
    slownode_round_timeout: float
