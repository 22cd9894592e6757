"""``--token-scope agents`` (issue 29, the chart's default): the token guards the agent stream, PubFault
and HTTP writes, while the reference's job-side clients (TaskD, MindIO, platforms), which send no
token, keep working: a Recover Init and a fault.Fault Register without a token are answered."""

from __future__ import annotations

import aiohttp
import grpc
import pytest
from support import make_clusterd, public_request

from faultmesh._pb import fault_pb2, fault_pb2_grpc, pubfault_pb2_grpc, recover_pb2, recover_pb2_grpc
from faultmesh.agent import open_stream


@pytest.fixture
async def cd(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    cd = await make_clusterd(tmp_path, "--token-file", str(tok), "--token-scope", "agents")
    yield cd
    await cd.stop()


async def test_job_side_rpcs_need_no_token(cd):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        r = await recover_pb2_grpc.RecoverStub(ch).Init(recover_pb2.ClientInfo(jobId="job-x", role="taskd"))
        assert r.code == 502  # answered (unknown job), not UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as e:  # refused for the unknown job, as the reference
            await fault_pb2_grpc.FaultStub(ch).Register(fault_pb2.ClientInfo(jobId="job-xyz-1", role="ctl"))
        assert e.value.code() == grpc.StatusCode.UNKNOWN and "402" in e.value.details()


async def test_agent_stream_pubfault_and_http_writes_still_need_it(cd):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await pubfault_pb2_grpc.PubFaultStub(ch).SendPublicFault(public_request("fault-scope-1"))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await open_stream(ch, None, accept_timeout_s=5.0)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{cd.http.port}/v1/jobs", data=b"{}") as r:
            assert r.status == 401
    assert cd.center.faults() == []


async def test_an_unknown_scope_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        await make_clusterd(tmp_path, "--token-scope", "some")
    assert e.value.code == 2
