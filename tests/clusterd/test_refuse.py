"""clusterd.api.refuse.refusing: the one "turn this call away" handler of the follower gate, the
token check and the unary rate limit. Every RPC kind gets the status it is refused with (a handler
of the wrong kind would make grpcio answer something else), the original handler never runs, and
the per-call hook sees each refused call."""

from __future__ import annotations

import grpc
import pytest

from clusterd.api.refuse import refusing

SERVICE = "test.Refuse"
ran: list[str] = []


async def _unary(request, context):
    ran.append("handler")
    return request


async def _stream(request, context):
    ran.append("handler")
    yield request


async def _client_stream(requests, context):
    ran.append("handler")
    return b"x"


async def _bidi(requests, context):
    ran.append("handler")
    yield b"x"


def _identity(b: bytes) -> bytes:
    return b


HANDLERS = {
    "UU": grpc.unary_unary_rpc_method_handler(_unary, _identity, _identity),
    "US": grpc.unary_stream_rpc_method_handler(_stream, _identity, _identity),
    "SU": grpc.stream_unary_rpc_method_handler(_client_stream, _identity, _identity),
    "SS": grpc.stream_stream_rpc_method_handler(_bidi, _identity, _identity),
}


class _Refuse(grpc.aio.ServerInterceptor):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        return refusing(
            handler,
            grpc.StatusCode.PERMISSION_DENIED,
            f"no: {details.method}",
            lambda context: self.calls.append(details.method),
        )


async def _one_request():
    yield b"r"


async def test_every_rpc_kind_is_refused_with_its_status_and_never_runs():
    calls: list[str] = []
    ran.clear()
    server = grpc.aio.server(interceptors=[_Refuse(calls)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, HANDLERS),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            kinds = {
                "UU": lambda m: ch.unary_unary(m)(b"r", timeout=5),
                "US": lambda m: _drain(ch.unary_stream(m)(b"r", timeout=5)),
                "SU": lambda m: ch.stream_unary(m)(_one_request(), timeout=5),
                "SS": lambda m: _drain(ch.stream_stream(m)(_one_request(), timeout=5)),
                "Unknown": lambda m: _drain(ch.stream_stream(m)(_one_request(), timeout=5)),
            }
            for name, call in kinds.items():
                method = f"/{SERVICE}/{name}"
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(method)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                assert err.value.details() == f"no: {method}", name
    finally:
        await server.stop(None)
    assert ran == []
    assert calls == [f"/{SERVICE}/{k}" for k in ("UU", "US", "SU", "SS", "Unknown")]


async def _drain(call) -> list:
    return [m async for m in call]
