"""gRPC helpers for the operator CLI: a channel to ClusterD and errors as :class:`CliError`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import grpc

from faultmesh.cli.common import CliError, token


def call(args: argparse.Namespace, stub_cls, method: str, request: Any, timeout_s: float = 10.0) -> Any:
    """Unary call ``method`` on ClusterD at ``args.grpc``; gRPC failures become :class:`CliError`."""
    tok = token(args)
    md = (("authorization", f"Bearer {tok}"),) if tok else None
    with grpc.insecure_channel(args.grpc) as ch:
        try:
            return getattr(stub_cls(ch), method)(request, timeout=timeout_s, metadata=md)
        except grpc.RpcError as e:
            raise CliError(f"{method}: {_why(e)}") from None


def first_of_stream(args: argparse.Namespace, stub_cls, method: str, request: Any, timeout_s: float) -> Any:
    """The first message of server stream ``method`` (waits at most ``timeout_s``)."""
    tok = token(args)
    md = (("authorization", f"Bearer {tok}"),) if tok else None
    with grpc.insecure_channel(args.grpc) as ch:
        call = getattr(stub_cls(ch), method)(request, timeout=timeout_s, metadata=md)
        try:
            for msg in call:
                return msg
        except grpc.RpcError as e:
            raise CliError(f"{method}: {_why(e)}") from None
        finally:
            call.cancel()  # never leave a live stream behind when the channel closes
    raise CliError(f"{method}: the stream ended without a message")


def _why(e: grpc.RpcError) -> str:
    code: Callable[[], grpc.StatusCode] = getattr(e, "code", lambda: grpc.StatusCode.UNKNOWN)
    if code() == grpc.StatusCode.UNAVAILABLE:
        return f"clusterd unreachable ({e.details()})"
    if code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "no answer in time"
    return f"{code().name}: {e.details()}"
