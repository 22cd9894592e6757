"""The agent stream's connection settings, shared by NodeD and deviced: the ClusterD flags
(address, TLS, token, keepalive, heartbeat), the gRPC channel options and TLS credentials.

Split out of :mod:`faultmesh.agent` (which re-exports every name here). Liveness (issue 20): the
agent's gRPC keepalive is ``--clusterd-keepalive-s`` / ``--clusterd-keepalive-timeout-s`` (60 / 5 s,
clusterd.md §1) and ``--clusterd-heartbeat-s`` (10 s) is how long the stream may stay silent before
an empty Delta goes out, ClusterD's liveness signal (its ``--agent-stale-after-s``).

Node identity (issue 29): ``--node-ip`` (env ``NODE_IP``, the chart fills it from the Downward API
``status.hostIP``; the older ``XDL_IP`` is read when ``NODE_IP`` is not set) goes in the Hello and
shows in ClusterD's ``/v1/nodes``; it must be an IPv4 or IPv6 address (else exit 2 naming the flag).
``--clusterd-backoff-max`` (10 s, 0.5..3600) is the longest wait between reconnects, on both agents.
The liveness and backoff flags are range-checked at start (exit 2 naming the flag): a zero, negative
or NaN value used to be taken silently (the backoff clamped to 0.5 s, a negative keepalive handed to
gRPC).
"""

from __future__ import annotations

import argparse
import ipaddress
import os

import grpc

from faultmesh.config import check_tls_pair, non_negative_float, number_in, positive_float

KEEPALIVE_S = 60.0  # gRPC keepalive ping after this long idle (clusterd.md §1)
KEEPALIVE_TIMEOUT_S = 5.0  # ... and its ack timeout
MAX_MESSAGE_BYTES = 4 << 20  # ClusterD receives messages up to 4 MiB (clusterd.md §1)
HEARTBEAT_S = 10.0  # an empty Delta after this long without a message: ClusterD's liveness signal
BACKOFF_MAX_S = 10.0  # the longest wait between reconnects to ClusterD
BACKOFF_MIN_S = 0.5  # the first wait (faultmesh.agent's Backoff): the least --clusterd-backoff-max can be
BACKOFF_MAX_LIMIT_S = 3600.0  # the most: an agent that waits longer misses whole fault episodes
NODE_IP_ENV = ("NODE_IP", "XDL_IP")  # --node-ip's environment, first set wins (XDL_IP: the older name)


def channel_options(keepalive_s: float = KEEPALIVE_S, keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S):
    """gRPC channel options matching ClusterD's server limits (clusterd.md §1), keepalive in s."""
    return [
        ("grpc.max_receive_message_length", 8 << 20),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


CHANNEL_OPTIONS = channel_options()


def agent_options(args) -> dict[str, float | str]:
    """The :class:`AgentClient` keywords from the flags of :func:`add_clusterd_arguments`: liveness
    (keepalive, heartbeat), ``backoff_max_s`` and the Hello's ``node_ip`` ("" when unknown)."""
    return {
        "keepalive_s": getattr(args, "clusterd_keepalive_s", KEEPALIVE_S),
        "keepalive_timeout_s": getattr(args, "clusterd_keepalive_timeout_s", KEEPALIVE_TIMEOUT_S),
        "heartbeat_s": getattr(args, "clusterd_heartbeat_s", HEARTBEAT_S),
        "backoff_max_s": getattr(args, "clusterd_backoff_max", BACKOFF_MAX_S),
        "node_ip": getattr(args, "node_ip", None) or "",
    }


def ip_address_arg(text: str) -> str:
    """argparse ``type=`` check of ``--node-ip``: an IPv4 or IPv6 address (stdlib ``ipaddress``),
    returned in its compressed form (``10.0.0.1``, ``fd00::1``). Raises
    ``argparse.ArgumentTypeError`` (exit 2 naming the flag) for anything else, a host name included:
    ClusterD puts the value where the reference expects an IP (job summary ``host_ip``). The
    unspecified address (``0.0.0.0``, ``::``, a listen address copied by mistake) and a multicast
    one are refused too: no peer can reach a node there."""
    try:
        ip = ipaddress.ip_address(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{str(text)[:64]!r} is not an IP address (env {' or '.join(NODE_IP_ENV)} counts too)"
        ) from None
    if ip.is_unspecified or ip.is_multicast:
        what = "the unspecified address" if ip.is_unspecified else "a multicast address"
        raise argparse.ArgumentTypeError(f"{str(ip)!r} is {what}, not a node's: give the node's own IP")
    return str(ip)


def env_node_ip() -> str | None:
    """The node IP from the environment: ``NODE_IP``, else ``XDL_IP``; None when neither is set."""
    return next((v for v in (os.environ.get(k, "").strip() for k in NODE_IP_ENV) if v), None)


def add_clusterd_arguments(parser) -> None:
    """The agent's ClusterD flags, shared by NodeD and deviced: ``--node-ip`` (the Hello's node IP,
    default env ``NODE_IP`` then ``XDL_IP``; :func:`ip_address_arg`), ``--clusterd host:port``,
    ``--clusterd-tls-ca/--tls-ca``, ``--clusterd-tls-cert/--tls-cert``, ``--clusterd-tls-key/--tls-key``
    (PEM files; a CA turns TLS on, cert + key add mTLS), ``--clusterd-token-file/--token-file`` and
    the liveness flags ``--clusterd-keepalive-s`` (60), ``--clusterd-keepalive-timeout-s`` (5),
    ``--clusterd-heartbeat-s`` (10) and ``--clusterd-backoff-max`` (10; see :func:`agent_options`)."""
    parser.add_argument(
        "--node-ip",
        type=ip_address_arg,
        default=env_node_ip(),
        help="this node's IP address, sent to ClusterD and shown in /v1/nodes (env NODE_IP, else XDL_IP)",
    )
    parser.add_argument(
        "--clusterd", default="127.0.0.1:8899", help="ClusterD agent-stream address host:port"
    )
    parser.add_argument(
        "--clusterd-tls-ca",
        "--tls-ca",
        dest="tls_ca",
        help="PEM CA of ClusterD's certificate: use TLS to ClusterD",
    )
    parser.add_argument(
        "--clusterd-tls-cert", "--tls-cert", dest="tls_cert", help="PEM client certificate (mTLS)"
    )
    parser.add_argument(
        "--clusterd-tls-key", "--tls-key", dest="tls_key", help="PEM key of --clusterd-tls-cert"
    )
    parser.add_argument(
        "--clusterd-token-file",
        "--token-file",
        dest="token_file",
        help="bearer token file for the agent stream",
    )
    parser.add_argument(
        "--clusterd-keepalive-s",
        type=positive_float,
        default=KEEPALIVE_S,
        help="gRPC keepalive ping period (s)",
    )
    parser.add_argument(
        "--clusterd-keepalive-timeout-s",
        type=positive_float,
        default=KEEPALIVE_TIMEOUT_S,
        help="gRPC keepalive ack timeout (s)",
    )
    parser.add_argument(
        "--clusterd-heartbeat-s",
        type=non_negative_float,
        default=HEARTBEAT_S,
        help="send an empty delta after this long without a message (s; 0: off); keep it well under "
        "ClusterD's --agent-stale-after-s",
    )
    parser.add_argument(
        "--clusterd-backoff-max",
        type=number_in(float, BACKOFF_MIN_S, BACKOFF_MAX_LIMIT_S),
        default=BACKOFF_MAX_S,
        help=f"longest wait between reconnects to ClusterD (s, {BACKOFF_MIN_S:g}..{BACKOFF_MAX_LIMIT_S:g})",
    )


def check_clusterd_arguments(parser, args) -> None:
    """Usage error (exit 2, naming the missing flag) unless ``--clusterd-tls-cert`` and
    ``--clusterd-tls-key`` come together (:func:`faultmesh.config.check_tls_pair`, clusterd's own
    check of its pair), and unless the pair comes with ``--clusterd-tls-ca``: TLS is on only with a
    CA (:func:`channel_credentials`), so a client pair without one went plaintext without a word
    (the chart passes the CA alone, never the pair without it). Call it after
    :func:`faultmesh.config.parse`."""
    check_tls_pair(parser, args, "the PEM client certificate")
    if args.tls_cert and not args.tls_ca:
        flags = {a.dest: "/".join(a.option_strings) for a in parser._actions if a.option_strings}
        parser.error(
            f"{flags['tls_cert']} needs {flags['tls_ca']} (the PEM CA of ClusterD's certificate): "
            "without it the stream to ClusterD would be plaintext"
        )


def channel_credentials(args) -> grpc.ChannelCredentials | None:
    """TLS credentials to ClusterD from the flags of :func:`add_clusterd_arguments` (None: plaintext).

    Raises ``OSError`` when a PEM file cannot be read.
    """
    if not args.tls_ca:
        return None
    with open(args.tls_ca, "rb") as f:
        ca = f.read()
    cert = key = None
    if args.tls_cert:
        with open(args.tls_cert, "rb") as f:
            cert = f.read()
    if args.tls_key:
        with open(args.tls_key, "rb") as f:
            key = f.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
