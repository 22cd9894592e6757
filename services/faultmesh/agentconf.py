"""The agent stream's connection settings, shared by NodeD and deviced: the ClusterD flags
(address, TLS, token, keepalive, heartbeat), the gRPC channel options and TLS credentials.

Split out of :mod:`faultmesh.agent` (which re-exports every name here). Liveness (issue 20): the
agent's gRPC keepalive is ``--clusterd-keepalive-s`` / ``--clusterd-keepalive-timeout-s`` (60 / 5 s,
clusterd.md §1) and ``--clusterd-heartbeat-s`` (10 s) is how long the stream may stay silent before
an empty Delta goes out, ClusterD's liveness signal (its ``--agent-stale-after-s``).
"""

from __future__ import annotations

import grpc

from faultmesh.config import check_tls_pair

KEEPALIVE_S = 60.0  # gRPC keepalive ping after this long idle (clusterd.md §1)
KEEPALIVE_TIMEOUT_S = 5.0  # ... and its ack timeout
HEARTBEAT_S = 10.0  # an empty Delta after this long without a message: ClusterD's liveness signal


def channel_options(keepalive_s: float = KEEPALIVE_S, keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S):
    """gRPC channel options matching ClusterD's server limits (clusterd.md §1), keepalive in s."""
    return [
        ("grpc.max_receive_message_length", 8 << 20),
        ("grpc.max_send_message_length", 4 << 20),
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


CHANNEL_OPTIONS = channel_options()


def agent_options(args) -> dict[str, float]:
    """The :class:`AgentClient` liveness keywords from the flags of :func:`add_clusterd_arguments`."""
    return {
        "keepalive_s": getattr(args, "clusterd_keepalive_s", KEEPALIVE_S),
        "keepalive_timeout_s": getattr(args, "clusterd_keepalive_timeout_s", KEEPALIVE_TIMEOUT_S),
        "heartbeat_s": getattr(args, "clusterd_heartbeat_s", HEARTBEAT_S),
    }


def add_clusterd_arguments(parser) -> None:
    """The agent's ClusterD flags, shared by NodeD and deviced: ``--clusterd host:port``,
    ``--clusterd-tls-ca/--tls-ca``, ``--clusterd-tls-cert/--tls-cert``, ``--clusterd-tls-key/--tls-key``
    (PEM files; a CA turns TLS on, cert + key add mTLS), ``--clusterd-token-file/--token-file`` and
    the liveness flags ``--clusterd-keepalive-s`` (60), ``--clusterd-keepalive-timeout-s`` (5),
    ``--clusterd-heartbeat-s`` (10; see :func:`agent_options`)."""
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
        "--clusterd-keepalive-s", type=float, default=KEEPALIVE_S, help="gRPC keepalive ping period (s)"
    )
    parser.add_argument(
        "--clusterd-keepalive-timeout-s",
        type=float,
        default=KEEPALIVE_TIMEOUT_S,
        help="gRPC keepalive ack timeout (s)",
    )
    parser.add_argument(
        "--clusterd-heartbeat-s",
        type=float,
        default=HEARTBEAT_S,
        help="send an empty delta after this long without a message (s; 0: off); keep it well under "
        "ClusterD's --agent-stale-after-s",
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
