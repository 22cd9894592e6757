"""ClusterD's gRPC server: the reference's transport limits, per-method token buckets, TLS, token.

Limits (clusterd.md §1): 4 MiB receive, 8 MiB send, 64 concurrent streams per connection, keepalive
ping after 60 s idle with a 5 s ack timeout (``--grpc-keepalive-s`` / ``--grpc-keepalive-timeout-s``),
client pings allowed every >= 3 s without streams.
Unary calls pass a token bucket keyed by method: ``/Recover/HealthCheck`` 10000/s (burst 10000), every
other unary method one shared bucket of 1000/s (burst 1000). A rejected call is answered like the
reference: status UNKNOWN, message ``qps exceeded, method=<m>``, and counted. Streaming RPCs are not
throttled here.

At most ``--max-connections`` (1024, as the reference) connections are accepted at once (gRPC core's
``grpc.max_allowed_incoming_connections``: an extra connection gets GOAWAY). Not enforced: the
reference's 512-per-source-IP cap (grpcio exposes no per-peer accept hook).

Undecodable protobuf (:class:`DecodeGuardInterceptor`, issue 19 #9): a request that does not parse is
answered ``INVALID_ARGUMENT`` (grpcio's own answer is ``UNKNOWN "Unexpected DecodeError"`` plus an
ERROR traceback per call), counted in ``faultmesh_rejected_requests_total{service,reason="undecodable"}``
(``service``: the label the token check uses for that method, :data:`clusterd.auth.PROTECTED`, else
the gRPC service name) and logged once a minute per service with the count of the suppressed ones.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable

import grpc
from prometheus_client import Counter

from clusterd.api.refuse import refusing
from faultmesh.log import RateLimitedLog
from faultmesh.ratelimit import TokenBucket

log = logging.getLogger("clusterd.grpc")

HEALTH_CHECK = "/Recover/HealthCheck"

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 4 << 20),
    ("grpc.max_send_message_length", 8 << 20),
    ("grpc.max_concurrent_streams", 64),
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),
]


class RateLimitInterceptor(grpc.aio.ServerInterceptor):
    """Per-method token buckets for unary RPCs (see module docstring)."""

    def __init__(self, rejected: Counter, unary_rate: float = 1000.0, health_rate: float = 10000.0) -> None:
        self._shared = TokenBucket(unary_rate, unary_rate)
        self._health = TokenBucket(health_rate, health_rate)
        self._rejected = rejected

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        bucket = self._health if method == HEALTH_CHECK else self._shared
        if bucket.take():
            return handler
        self._rejected.labels(method.strip("/").split("/")[0] or "grpc", "qps_exceeded").inc()

        return refusing(handler, grpc.StatusCode.UNKNOWN, f"qps exceeded, method={method}")


class _Undecodable:
    """What the guarded deserializer returns for bytes that do not parse."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):
    """Answers undecodable requests ``INVALID_ARGUMENT`` (see the module docstring). Put it first.
    ``labels``: method path -> service label of the rejected-requests counter."""

    def __init__(self, rejected: Counter, labels: dict[str, str] | None = None) -> None:
        self._rejected = rejected
        self._labels = labels or {}
        self._ratelog = RateLimitedLog(log)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        service = self._labels.get(method) or method.strip("/").split("/")[0] or "grpc"
        decode = handler.request_deserializer

        def safe(data: bytes):
            try:
                return decode(data)
            except Exception as e:  # DecodeError, or a message that fails its own checks
                return _Undecodable(e)

        async def refuse(request, context) -> None:
            self._rejected.labels(service, "undecodable").inc()
            self._ratelog.warning(
                f"undecodable:{service}",
                "request undecodable",
                method=method,
                peer=context.peer(),
                error=str(request.error)[:200],
            )
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request undecodable: {method}")

        async def guarded(requests, context):
            async for r in requests:
                if isinstance(r, _Undecodable):
                    await refuse(r, context)
                yield r

        kw = {"request_deserializer": safe, "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def uu(request, context):
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(uu, **kw)
        if handler.unary_stream is not None:
            inner = handler.unary_stream
            if inspect.isasyncgenfunction(inner):

                async def us(request, context):
                    if isinstance(request, _Undecodable):
                        await refuse(request, context)
                    async for m in inner(request, context):
                        yield m

            else:

                async def us(request, context):
                    if isinstance(request, _Undecodable):
                        await refuse(request, context)
                    return await inner(request, context)

            return grpc.unary_stream_rpc_method_handler(us, **kw)
        if handler.stream_unary is not None:
            inner = handler.stream_unary

            async def su(requests, context):
                return await inner(guarded(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(su, **kw)
        inner = handler.stream_stream
        if inspect.isasyncgenfunction(inner):

            async def ss(requests, context):
                async for m in inner(guarded(requests, context), context):
                    yield m

        else:

            async def ss(requests, context):
                return await inner(guarded(requests, context), context)

        return grpc.stream_stream_rpc_method_handler(ss, **kw)


def server_options(
    max_connections: int = 1024, keepalive_s: float = 60.0, keepalive_timeout_s: float = 5.0
) -> list[tuple[str, int]]:
    """:data:`SERVER_OPTIONS` with the keepalive ping period / ack timeout (s; ``--grpc-keepalive-s``,
    ``--grpc-keepalive-timeout-s``) plus the connection cap (``max_connections`` >= 1)."""
    keep = {
        "grpc.keepalive_time_ms": int(keepalive_s * 1000),
        "grpc.keepalive_timeout_ms": int(keepalive_timeout_s * 1000),
    }
    opts = [(k, keep.get(k, v)) for k, v in SERVER_OPTIONS]
    return [*opts, ("grpc.max_allowed_incoming_connections", max_connections)]


def server_credentials(cert: str, key: str, ca: str | None) -> grpc.ServerCredentials:
    """TLS credentials from PEM files; with ``ca`` the client must present a cert signed by it (mTLS)."""
    with open(cert, "rb") as f:
        cert_pem = f.read()
    with open(key, "rb") as f:
        key_pem = f.read()
    ca_pem = None
    if ca:
        with open(ca, "rb") as f:
            ca_pem = f.read()
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=ca_pem is not None
    )


def bind_grpc(server: grpc.aio.Server, addr: str, cert: str | None, key: str | None, ca: str | None) -> int:
    """Add ``addr`` (host:port, port 0: the OS picks) to ``server``, TLS when ``cert`` is set; the
    bound port. Raises ``OSError("cannot bind gRPC address ADDR: REASON")``: gRPC itself says only
    that the port could not be added, so the reason is the OS's own answer to a plain bind of the
    same address (``[Errno 98] Address already in use``), else an unreadable certificate or key."""
    err: Exception | None = None
    try:
        port = (
            server.add_secure_port(addr, server_credentials(cert, key, ca))
            if cert
            else server.add_insecure_port(addr)
        )
    except RuntimeError as e:  # grpcio raises this when the port is taken
        port, err = 0, e
    if port:
        return port
    reason = _bind_reason(addr)
    if not reason and cert:  # the address binds: gRPC refused the credentials
        reason = f"gRPC refused the TLS certificate / key ({cert}, {key}): not a PEM certificate and its key?"
    raise OSError(f"cannot bind gRPC address {addr}: {reason or err or 'not available'}")


def _bind_reason(addr: str) -> str:
    """The OS's error for a TCP bind of ``addr`` ("" when it binds, or the address is not host:port)."""
    import socket

    host, _, port = addr.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (ValueError, OSError) as e:
        return str(e)
    fam, _, _, _, sa = infos[0]
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        try:
            s.bind(sa)
        except OSError as e:
            return str(e)
    return ""


# -- health and reflection (issue 17 "gRPC") ---------------------------------------------------------
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_reflection_v1_descriptor() -> None:
    """Put ``grpc.reflection.v1`` into the default descriptor pool, so that reflection can describe
    its own v1 service. grpcio-reflection (<= 1.85) ships only v1alpha (grpc/grpc#38576); v1 is the
    same schema under another package (grpc-proto reflection/v1/reflection.proto: same messages,
    same field numbers), so it is derived from v1alpha's descriptor rather than compiled."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from grpc_reflection.v1alpha import reflection_pb2

    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old, new = f".{fdp.package}.", ".grpc.reflection.v1."
    fdp.name, fdp.package = _V1_FILE, "grpc.reflection.v1"
    messages = list(fdp.message_type)
    while messages:
        m = messages.pop()
        messages.extend(m.nested_type)
        for f in m.field:
            if f.type_name:
                f.type_name = f.type_name.replace(old, new, 1)
    for svc in fdp.service:
        for meth in svc.method:
            meth.input_type = meth.input_type.replace(old, new, 1)
            meth.output_type = meth.output_type.replace(old, new, 1)
    pool.AddSerializedFile(fdp.SerializeToString())


def add_health_and_reflection(server: grpc.aio.Server, health_servicer, services: Iterable[str]) -> list[str]:
    """Register the gRPC health service and server reflection (v1alpha and v1) on ``server``.

    ``services``: the full names of the application services served (``Recover``,
    ``faultmesh.v1.AgentStream``, ...). Returns every served name, sorted (the application's plus
    ``grpc.health.v1.Health`` and both reflection services): reflection's ``ListServices`` answers
    them and :func:`mark_serving` sets each one's health. Reflection v1 is answered by the v1alpha
    servicer: the two protocols are byte-identical on the wire (see
    :func:`_register_reflection_v1_descriptor`).
    """
    from grpc_health.v1 import health, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = sorted({*services, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1})
    _register_reflection_v1_descriptor()
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": v1}),)
    )
    return names


async def mark_serving(health_servicer, names: Iterable[str]) -> None:
    """Health ``SERVING`` for the server as a whole (``""``) and for each name in ``names``
    (``grpc.health.v1.Health/Check`` with ``service=<name>``; an unknown name is ``NOT_FOUND``).
    ``enter_graceful_shutdown`` later turns every one of them ``NOT_SERVING``."""
    from grpc_health.v1 import health_pb2

    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
