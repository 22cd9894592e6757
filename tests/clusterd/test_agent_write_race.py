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
