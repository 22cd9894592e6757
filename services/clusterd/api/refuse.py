"""One way for a clusterd gRPC interceptor to turn a call away (the follower gate, the token check,
the unary rate limit): a method handler of the same kind as the one it replaces, which aborts with a
status before it reads anything.

The kind must match, or grpcio answers the client ``UNIMPLEMENTED``/``INTERNAL`` instead of the
status meant for it (a unary-stream RPC refused by a unary handler never sends its status).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc


def refusing(
    handler: grpc.RpcMethodHandler | None,
    code: grpc.StatusCode,
    message: str,
    on_call: Callable[[grpc.aio.ServicerContext], None] | None = None,
) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind (unary-unary, unary-stream, stream-unary, stream-stream; a
    stream-stream one without (de)serializers when ``handler`` is None, an unknown method) whose every
    call runs ``on_call(context)`` (count, log; may be None) and then aborts with ``code`` and
    ``message``. The request is never read: nothing of the original handler runs."""

    async def deny(context) -> None:
        if on_call is not None:
            on_call(context)
        await context.abort(code, message)

    async def unary(request, context):
        await deny(context)

    async def streaming(request, context):
        await deny(context)
        yield  # pragma: no cover — abort raises

    if handler is None:
        return grpc.stream_stream_rpc_method_handler(streaming)
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **kw)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kw)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, **kw)
    return grpc.stream_stream_rpc_method_handler(streaming, **kw)
