"""ClusterD's own configuration section (issue 28; :func:`faultmesh.config.section`): the flags of
:func:`clusterd.app.build_parser` itself, read by the wiring (:class:`clusterd.app.ClusterD`) and the
replica runner (:mod:`clusterd.kube.ha`). The flags and their defaults are defined once, there."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoreConfig:
    """Serving: ``grpc_addr`` ``--grpc-addr``, ``http_addr`` ``--http-addr`` (host:port), TLS
    ``tls_cert`` ``--tls-cert``, ``tls_key`` ``--tls-key``, ``tls_ca`` ``--tls-ca`` (PEM files),
    ``max_connections`` ``--max-connections``, ``grpc_keepalive_s`` ``--grpc-keepalive-s`` and
    ``grpc_keepalive_timeout_s`` ``--grpc-keepalive-timeout-s`` (s), ``unary_qps`` ``--unary-qps``
    (req/s); the token: ``token_file`` ``--token-file``, ``token_scope`` ``--token-scope``
    (``all`` / ``agents``); the state file: ``state_dir`` ``--state-dir``, ``fsync_full``
    ``--fsync-full``, ``state_busy_timeout_ms`` ``--state-busy-timeout-ms``; agents:
    ``agent_stale_after_s`` ``--agent-stale-after-s``, ``agent_expire_after_s``
    ``--agent-expire-after-s`` (s); the isolation breaker: ``isolation_max_share``
    ``--isolation-max-share`` (0..1), ``isolation_window_s`` ``--isolation-window-s`` (s); the
    staged stop (s): ``shutdown_budget_s`` ``--shutdown-budget-s``, ``drain_s`` ``--drain-s``,
    ``component_stop_s`` ``--component-stop-s``, ``sink_drain_s`` ``--sink-drain-s``,
    ``task_stop_s`` ``--task-stop-s``."""

    grpc_addr: str
    http_addr: str
    tls_cert: str | None
    tls_key: str | None
    tls_ca: str | None
    max_connections: int
    grpc_keepalive_s: float
    grpc_keepalive_timeout_s: float
    unary_qps: float
    token_file: str | None
    token_scope: str
    state_dir: str
    fsync_full: bool
    state_busy_timeout_ms: int
    agent_stale_after_s: float
    agent_expire_after_s: float
    isolation_max_share: float
    isolation_window_s: float
    shutdown_budget_s: float
    drain_s: float
    component_stop_s: float
    sink_drain_s: float
    task_stop_s: float
