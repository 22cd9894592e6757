"""Fuzz SendPublicFault and the agent stream: ClusterD never crashes and memory equals the state file."""

from __future__ import annotations

import sqlite3

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultmesh._pb import agent_pb2, agent_pb2_grpc, pubfault_pb2, pubfault_pb2_grpc

text = st.text(max_size=40)
codes = st.sampled_from(["010001001", "220001001", "110001022", "12345678", "", "999999999"])
ids = st.one_of(text, st.from_regex(r"[a-z0-9\-]{8,20}", fullmatch=True))
times = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(1735689600000, 1999999999999)
)
influence = st.builds(
    pubfault_pb2.PubFaultInfo,
    nodeName=st.one_of(st.sampled_from(["node-1", "node-2", ""]), text),
    nodeSN=text,
    deviceIds=st.lists(st.integers(-5, 40), max_size=5),
)
faults = st.builds(
    pubfault_pb2.Fault,
    faultId=ids,
    faultType=st.sampled_from(["NPU", "Node", "Network", "Storage", "GPU"]),
    faultCode=codes,
    faultTime=times,
    assertion=st.sampled_from(["occur", "recover", "once", "x"]),
    faultLocation=st.dictionaries(text, text, max_size=12),
    influence=st.lists(influence, max_size=3),
    description=text,
)
requests = st.builds(
    pubfault_pb2.PublicFaultRequest,
    id=ids,
    timestamp=times,
    version=st.sampled_from(["1.0", "2", ""]),
    resource=st.sampled_from(["CCAE", "fd-online", "nobody"]),
    faults=st.lists(faults, max_size=4),
)
agent_faults = st.builds(
    agent_pb2.Fault,
    source=st.sampled_from(["bmc-oem", "dcmi", ""]),
    node=st.sampled_from(["", "node-1", "node-2"]),
    device_type=st.sampled_from(["NPU", "CPU", "x" * 70]),
    device_id=st.integers(-3, 2**21),
    code=st.sampled_from(["00000001", "80E01801", "", "z" * 40]),
    level=st.sampled_from(["SeparateNPU", "RestartNPU", "bogus"]),
    assertion=st.sampled_from(["", "occur", "later"]),
)
agent_msgs = st.one_of(
    st.builds(
        lambda s, f: agent_pb2.AgentMessage(snapshot=agent_pb2.Snapshot(seq=s, faults=f)),
        st.integers(0, 100),
        st.lists(agent_faults, max_size=4),
    ),
    st.builds(
        lambda s, f: agent_pb2.AgentMessage(delta=agent_pb2.Delta(seq=s, upserts=f)),
        st.integers(0, 100),
        st.lists(agent_faults, max_size=4),
    ),
    st.just(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1"))),
    st.just(agent_pb2.AgentMessage()),
)


def _stored(state_dir) -> list[tuple]:
    db = sqlite3.connect(state_dir / "clusterd.db")
    try:
        return sorted(
            db.execute("SELECT node, device_type, device_id, code, source, level FROM faults").fetchall()
        )
    finally:
        db.close()


def _served(cd) -> list[tuple]:
    return sorted(
        (f["node"], f["device_type"], f["device_id"], f["code"], f["source"], f["level"])
        for f in cd.get_json("/v1/faults")
    )


def _agent_session(stub, msgs) -> None:
    def gen():
        yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", agent="noded"))
        yield from msgs

    try:
        for _ in stub.Connect(gen(), timeout=3):
            pass
    except grpc.RpcError:
        pass


def test_fuzz_public_faults_and_agent_streams(clusterd_process):
    cd = clusterd_process("--unary-qps", "100000")
    with grpc.insecure_channel(cd.grpc) as ch:
        pub = pubfault_pb2_grpc.PubFaultStub(ch)
        agent = agent_pb2_grpc.AgentStreamStub(ch)

        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(reqs=st.lists(requests, min_size=1, max_size=3), msgs=st.lists(agent_msgs, max_size=6))
        def one(reqs, msgs):
            for r in reqs:
                assert pub.SendPublicFault(r, timeout=5).code in (0, 409, 410)
            _agent_session(agent, msgs)
            assert cd.proc.poll() is None, cd.log_text()[-2000:]

        one()
    assert cd.get_json("/v1/nodes") is not None
    assert _served(cd) == _stored(cd.state_dir)
    assert cd.proc.poll() is None
    assert "Traceback" not in cd.log_text()
