"""What generic gRPC tools and load balancers see on clusterd's port (issue 17 "gRPC").

A real clusterd process; a plain grpc client asks ``grpc.health.v1.Health/Check`` for every service
it serves (not only ``""``) and lists the services through server reflection, both the v1 protocol
(grpc.reflection.v1, what grpcurl and Postman try first) and the older v1alpha.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

SERVICES = {
    "Recover",
    "PubFault",
    "faultmesh.v1.AgentStream",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}


def _reflect(channel: grpc.Channel, version: str, **request) -> reflection_pb2.ServerReflectionResponse:
    """One request on ``/grpc.reflection.<version>.ServerReflection/ServerReflectionInfo``."""
    call = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return next(call(iter([reflection_pb2.ServerReflectionRequest(**request)]), timeout=10))


def _listed(channel: grpc.Channel, version: str) -> set[str]:
    resp = _reflect(channel, version, list_services="")
    return {s.name for s in resp.list_services_response.service}


def test_health_answers_for_every_served_service(clusterd_process):
    cd = clusterd_process()
    with grpc.insecure_channel(cd.grpc) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        served = _listed(ch, "v1")
        assert served >= SERVICES
        for name in ["", *sorted(served)]:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.RpcError) as e:
            stub.Check(health_pb2.HealthCheckRequest(service="NoSuchService"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_v1_and_v1alpha_list_and_describe(clusterd_process):
    cd = clusterd_process()
    with grpc.insecure_channel(cd.grpc) as ch:
        v1, v1alpha = _listed(ch, "v1"), _listed(ch, "v1alpha")
        assert v1 == v1alpha and v1 >= SERVICES
        for version in ("v1", "v1alpha"):
            # describe: the file that defines a service, as grpcurl describe does
            for symbol, method in (("Recover", "HealthCheck"), ("grpc.reflection.v1.ServerReflection", None)):
                resp = _reflect(ch, version, file_containing_symbol=symbol)
                assert not resp.HasField("error_response"), (version, symbol, resp.error_response)
                files = [
                    descriptor_pb2.FileDescriptorProto.FromString(b)
                    for b in resp.file_descriptor_response.file_descriptor_proto
                ]
                svc = {f"{f.package + '.' if f.package else ''}{s.name}": s for f in files for s in f.service}
                assert symbol in svc, (version, sorted(svc))
                if method:
                    assert method in {m.name for m in svc[symbol].method}
            resp = _reflect(ch, version, file_containing_symbol="no.such.Symbol")
            assert resp.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
