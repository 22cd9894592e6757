"""The agent client writes its acks of control messages and its own deltas on one stream: never
two writes at once (grpcio's client fails the whole stream with INTERNAL "Internal error from
Core", GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, when a second write starts before the first is done)."""

from __future__ import annotations

import asyncio

from support import eventually

from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentClient
from faultmesh.model import Fault


async def test_control_acks_and_deltas_written_at_once_keep_the_stream_up(cd):
    got: list[int] = []

    async def on_control(msg):
        got.append(msg.seq)

    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", on_control=on_control)
    await client.start()
    try:
        await client.wait_synced()
        reconnects = client.metrics.reconnects._value.get()  # sessions opened so far
        attrs = {f"a{i}": "x" * 200 for i in range(60)}  # ~13 kB a fault: the writes take a while

        async def churn():
            for i in range(400):
                client.state.upsert(
                    Fault(
                        source="bmc-oem",
                        node="node-1",
                        device_type="CPU",
                        device_id=i % 16,
                        code=f"{i:08d}",
                        level="SeparateFault",
                        attributes=attrs,
                    )  # fmt: skip
                )
                await asyncio.sleep(0)

        sw = agent_pb2.DataTraceSwitch(job_ns_name="ns/job", communication_operator="on" * 2000)
        churner = asyncio.create_task(churn())
        for _ in range(300):
            assert await cd.agents.send("node-1", "noded", data_trace=sw)
            await asyncio.sleep(0)
        await churner

        def sessions() -> float:
            return client.metrics.reconnects._value.get()

        # all handled, or the stream broke (then it would have to be opened again)
        await eventually(lambda: len(got) >= 300 or sessions() > reconnects, 60, "300 control messages")
        assert sessions() == reconnects, client.down_reason  # was: INTERNAL "Internal error from Core"
        await client.wait_synced(30)
        assert client.connected.is_set()
    finally:
        await client.stop()


def _big_fault(i: int, attrs: dict[str, str]) -> Fault:
    return Fault(source="bmc-oem", node="node-1", device_type="CPU", device_id=i % 16, code=f"{i:08d}",
                 level="SeparateFault", attributes=attrs)  # fmt: skip


def test_a_delta_stops_near_its_byte_budget_and_the_rest_stays_pending():
    from faultmesh.agentstate import AgentState

    st = AgentState("node-1")
    attrs = {f"a{i}": "x" * 200 for i in range(60)}  # ~13 kB a fault
    for i in range(100):
        st.upsert(_big_fault(i, attrs))
    sizes, codes = [], set()
    while st.has_pending():
        d = st.take_delta(len(sizes) + 1, max_bytes=200_000)
        sizes.append(d.ByteSize())
        codes |= {u.code for u in d.upserts}
    assert codes == {f"{i:08d}" for i in range(100)} and len(sizes) > 1
    assert max(sizes) < 200_000 + 14_000  # the budget plus at most one fault


async def test_a_fault_storm_over_the_message_limit_arrives_in_several_deltas(cd):
    # 400 faults of ~13 kB changed at once: one delta would be ~5 MB, over ClusterD's 4 MiB receive
    # limit, and grpcio failed the whole stream (INTERNAL "Internal error from Core") at every try
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    await client.start()
    try:
        await client.wait_synced()
        reconnects = client.metrics.reconnects._value.get()
        attrs = {f"a{i}": "x" * 200 for i in range(60)}
        for i in range(400):  # no yield: the session sees them all at once
            client.state.upsert(_big_fault(i, attrs))
        await eventually(lambda: len(cd.center.faults_of_node("node-1")) >= 400, 60, "400 faults in clusterd")
        assert client.metrics.reconnects._value.get() == reconnects, client.down_reason
    finally:
        await client.stop()


def _big_state(n: int = 400):
    from faultmesh.agentstate import AgentState

    st = AgentState("node-1")
    attrs = {f"a{i}": "x" * 200 for i in range(60)}  # ~13 kB a fault: 400 take ~5 MB
    for i in range(n):
        st.upsert(_big_fault(i, attrs))
    return st


async def test_a_state_over_the_message_limit_goes_in_parts(cd):
    # a snapshot of ~5 MB, over ClusterD's 4 MiB receive limit: ClusterD says it collects parts
    client = AgentClient(
        f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", state=_big_state(), resync_by_digest=False
    )
    await client.start()
    try:
        await client.wait_synced(60)
        assert len(cd.center.faults_of_node("node-1")) == 400
        assert client.metrics.sent.labels("snapshot_part")._value.get() >= 5
        assert client.metrics.reconnects._value.get() == 1, client.down_reason
    finally:
        await client.stop()


async def test_a_state_over_the_message_limit_is_said_so_to_an_older_clusterd(cd, caplog):
    # an older ClusterD says nothing of parts (no response header): it would take part 0 for the
    # whole state and recover the faults of the other parts, so the agent sends none and says why
    # instead of grpcio's INTERNAL "Internal error from Core"
    cd.agents.parts.header = lambda: ()
    client = AgentClient(
        f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", state=_big_state(), resync_by_digest=False
    )
    await client.start()
    try:
        await eventually(lambda: "state too large" in (client.down_reason or ""), 30, "the reason")
        assert "state too large for one message" in client.down_reason
        assert "bytes > 4194304" in client.down_reason
        assert any("state too large for one message" in r.getMessage() for r in caplog.records)
        assert client.metrics.sent.labels("snapshot_part")._value.get() == 0
        assert cd.center.faults_of_node("node-1") == []
    finally:
        await client.stop()


async def test_a_state_under_the_message_limit_goes_whole_to_an_older_clusterd(cd):
    cd.agents.parts.header = lambda: ()
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", state=_big_state(200))  # ~2.6 MB
    await client.start()
    try:
        await client.wait_synced(60)
        assert len(cd.center.faults_of_node("node-1")) == 200
        assert client.metrics.sent.labels("snapshot_part")._value.get() == 0
        assert client.metrics.sent.labels("snapshot")._value.get() == 1
    finally:
        await client.stop()
