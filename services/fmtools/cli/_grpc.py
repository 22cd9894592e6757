"""gRPC helpers for the operator CLI: a channel to ClusterD (plaintext, or TLS with
``--grpc-tls-ca``) and errors as :class:`CliError`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import grpc

from fmtools.cli.common import (
    CliError,
    NotFound,
    Rejected,
    Unreachable,
    UsageError,
    read_text,
    server_error,
    token,
)

PEM_MAX_BYTES = 1 << 20


def credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """TLS credentials to ClusterD's gRPC port from ``--grpc-tls-ca/-cert/-key``
    (:func:`fmtools.cli.common.add_grpc_tls_flags`); None (plaintext) without ``--grpc-tls-ca``.
    Raises :class:`UsageError` (exit 2, naming the flag) for a certificate without its key or the
    other way round, a client pair without the CA (it would have gone plaintext without a word, as
    the agents' check), a server name without the CA, a file that cannot be read or holds no PEM
    block."""
    ca, cert, key = (getattr(args, f"grpc_tls_{k}", None) for k in ("ca", "cert", "key"))
    if cert and not key:
        raise UsageError("--grpc-tls-cert needs --grpc-tls-key (the PEM private key of the certificate)")
    if key and not cert:
        raise UsageError("--grpc-tls-key needs --grpc-tls-cert (the PEM client certificate)")
    if cert and not ca:
        raise UsageError(
            "--grpc-tls-cert needs --grpc-tls-ca (the PEM CA of ClusterD's certificate): "
            "without it the call would be plaintext"
        )
    if getattr(args, "grpc_tls_server_name", None) and not ca:
        raise UsageError("--grpc-tls-server-name needs --grpc-tls-ca (it names the server TLS checks)")
    if not ca:
        return None
    pem = {}
    for flag, path in (("--grpc-tls-ca", ca), ("--grpc-tls-cert", cert), ("--grpc-tls-key", key)):
        if path:
            text = read_text(path, f"{flag} file", stdin=False, max_bytes=PEM_MAX_BYTES)
            if "-----BEGIN " not in text:
                raise UsageError(f"{flag} file {path} holds no PEM block")
            pem[flag] = text.encode()
    return grpc.ssl_channel_credentials(
        root_certificates=pem["--grpc-tls-ca"],
        private_key=pem.get("--grpc-tls-key"),
        certificate_chain=pem.get("--grpc-tls-cert"),
    )


def options(args: argparse.Namespace) -> list[tuple[str, str]]:
    """gRPC channel options: ``--grpc-tls-server-name`` as the TLS target name override."""
    name = getattr(args, "grpc_tls_server_name", None)
    return [("grpc.ssl_target_name_override", name)] if name else []


def channel(args: argparse.Namespace) -> grpc.Channel:
    """A channel to ClusterD at ``args.grpc``: TLS with :func:`credentials`, else plaintext."""
    creds = credentials(args)
    if creds is None:
        return grpc.insecure_channel(args.grpc)
    return grpc.secure_channel(args.grpc, creds, options=options(args))


def call(args: argparse.Namespace, stub_cls, method: str, request: Any, timeout_s: float = 10.0) -> Any:
    """Unary call ``method`` on ClusterD at ``args.grpc``; gRPC failures become :class:`CliError`."""
    tok = token(args)
    md = (("authorization", f"Bearer {tok}"),) if tok else None
    with channel(args) as ch:
        try:
            return getattr(stub_cls(ch), method)(request, timeout=timeout_s, metadata=md)
        except grpc.RpcError as e:
            raise _error(method, e) from None


def first_of_stream(args: argparse.Namespace, stub_cls, method: str, request: Any, timeout_s: float) -> Any:
    """The first message of server stream ``method`` (waits at most ``timeout_s``)."""
    tok = token(args)
    md = (("authorization", f"Bearer {tok}"),) if tok else None
    with channel(args) as ch:
        call = getattr(stub_cls(ch), method)(request, timeout=timeout_s, metadata=md)
        try:
            for msg in call:
                return msg
        except grpc.RpcError as e:
            raise _error(method, e, waiting=True) from None
        finally:
            call.cancel()  # never leave a live stream behind when the channel closes
    raise CliError(f"{method}: the stream ended without a message")


_REJECTED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


def _error(method: str, e: grpc.RpcError, waiting: bool = False) -> CliError:
    """The :class:`CliError` of a failed call: UNAVAILABLE -> Unreachable; DEADLINE_EXCEEDED ->
    Unreachable (the address takes the connection but never answers), or CliError while ``waiting``
    for an outcome on a stream; NOT_FOUND -> NotFound; a refusal (invalid argument, auth, ...) ->
    Rejected; any other code (the reference's UNKNOWN) -> what its text says
    (:func:`~fmtools.cli.common.server_error`: unknown job -> NotFound, rate limit -> Rejected),
    else CliError."""
    code: Callable[[], grpc.StatusCode] = getattr(e, "code", lambda: grpc.StatusCode.UNKNOWN)
    details: Callable[[], str] = getattr(e, "details", lambda: "")
    c = code()
    if c == grpc.StatusCode.UNAVAILABLE:
        return Unreachable(f"{method}: clusterd unreachable ({details()})")
    if c == grpc.StatusCode.DEADLINE_EXCEEDED:
        return (CliError if waiting else Unreachable)(f"{method}: no answer in time")
    if c == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{method}: {details()}")
    return server_error(f"{method}: {c.name}: {details()}", Rejected if c in _REJECTED else CliError)


def om_operation(
    args: argparse.Namespace,
    what: str,
    start: tuple[str, Any],
    reply: tuple[str, Any],
    ok: Callable[[str], bool],
    details: Callable[[str, bool], tuple[str, list[tuple], tuple[str, ...]]],
) -> int:
    """Run one Recover O&M operation (SwitchNicTrack, StressTest) as the operator CLI does.

    ``what``: the command (``stress-test``), shown in the progress line while the command waits
    (:func:`fmtools.cli.progress.wait_with_progress`: a spinner on a terminal, plain lines on
    stderr otherwise); ``start`` = (unary method, request); ``reply`` = (O&M reply stream method,
    request); ``ok(msg)`` judges the reply text; ``details(msg, ok)`` -> (summary, rows, headers)
    reads it for people: the summary line, then the rows as a table (``-o json|yaml``: the raw
    ``result`` plus ``details``, one object per row). Returns 0 when ``ok`` (or ``--no-wait``),
    else 1. A refused start (code != 0) raises :class:`Rejected` with the code and reason
    (:class:`NotFound` for an unknown job).
    """
    from faultmesh._pb import recover_pb2_grpc
    from fmtools.cli.common import emit, print_table, structured
    from fmtools.cli.progress import wait_with_progress

    st = call(args, recover_pb2_grpc.RecoverStub, start[0], start[1])
    if st.code != 0:
        raise server_error(f"{start[0]} refused: code {st.code}: {st.info}", Rejected)
    msg = st.info
    if not args.no_wait:
        msg = wait_with_progress(
            f"{what} {args.job_id}",
            lambda: (
                first_of_stream(args, recover_pb2_grpc.RecoverStub, reply[0], reply[1], args.timeout_s).msg
            ),
            args.timeout_s,
        )
    good = args.no_wait or ok(msg)
    summary, rows, headers = details(msg, good)
    if structured(args):
        keys = [h.lower() for h in headers]
        data = {
            "job_id": args.job_id,
            "code": st.code,
            "result": msg,
            "ok": good,
            "details": [dict(zip(keys, r, strict=True)) for r in rows],
        }
        emit(args, data, [], ())
    else:
        sys.stdout.write(f"job {args.job_id}: {summary}\n")
        if rows:
            sys.stdout.write("\n")
            print_table(rows, headers)
    return 0 if good else 1
