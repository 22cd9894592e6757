"""A resync that changes nothing writes nothing (issue 18): after a clusterd restart every agent
resends its whole state; only what differs from the stored state reaches the state file."""

from __future__ import annotations

from support import eventually, make_clusterd

from faultmesh.agent import AgentClient
from faultmesh.model import Fault


def npu(dev: int, level: str = "RestartNPU") -> Fault:
    return Fault(source="dcmi", node="node-1", device_type="NPU", device_id=dev, code="80E18008", level=level)


class WriteCount:
    """Counts the fault rows and node rows the store is asked to write."""

    def __init__(self, store) -> None:
        self.faults = 0
        self.nodes: list[str] = []
        wf, wn = store.write_faults, store.write_nodes

        async def write_faults(upserts=(), removals=(), marks=None):
            upserts, removals = list(upserts), list(removals)
            self.faults += len(upserts) + len(removals)
            await wf(upserts, removals, marks)

        async def write_nodes(states):
            self.nodes += list(states)
            await wn(states)

        store.write_faults, store.write_nodes = write_faults, write_nodes


async def test_an_unchanged_snapshot_after_a_restart_writes_no_fault(tmp_path):
    cd = await make_clusterd(tmp_path, "--drain-s", "0.1")  # the stop does not wait 5 s for the stream
    port = cd.grpc_port
    # the full-snapshot path (the digest path is tests/clusterd/test_agent_digest.py)
    client = AgentClient(f"127.0.0.1:{port}", "node-1", "deviced", backoff_max_s=0.2, resync_by_digest=False)
    client.state.upsert(npu(0))
    client.state.upsert(npu(1))
    await client.start()
    try:
        await client.wait_synced()
        await cd.stop()
        cd = await make_clusterd(tmp_path, "--grpc-addr", f"127.0.0.1:{port}")
        writes = WriteCount(cd.store)
        snapshots = cd.agents.messages.labels("snapshot")
        await eventually(
            lambda: snapshots._value.get() >= 1 and ("node-1", "deviced") in cd.agents.connected()
        )
        await client.wait_synced()
        assert len(cd.center.faults("node-1")) == 2
        assert writes.faults == 0  # the same two faults: nothing to store
        client.state.upsert(npu(1, "SeparateNPU"))  # a changed fault is stored
        await client.wait_synced()
        assert writes.faults == 1 and cd.center.faults("node-1")[1].level == "SeparateNPU"
    finally:
        await client.stop()
        await cd.stop()


async def test_an_unchanged_node_state_is_not_written_again(cd):
    writes = WriteCount(cd.store)
    dev = {"device_type": "NPU", "device_id": 0, "health": "Healthy"}
    cd.nodes.hello("node-1", "10.0.0.1", "SN-1", "boot-a")
    cd.nodes.update("node-1", devices=[dev], status="Healthy", replace=True)
    await cd.nodes.flush()
    assert writes.nodes == ["node-1"]
    cd.nodes.hello("node-1", "10.0.0.1", "SN-1", "boot-a")  # a reconnect saying the same
    cd.nodes.update("node-1", devices=[dict(dev)], status="Healthy", replace=True)
    cd.nodes.update("node-1", devices=[dict(dev)])
    await cd.nodes.flush()
    assert writes.nodes == ["node-1"]
    cd.nodes.update("node-1", devices=[dict(dev, health="UnHealthy")])  # a change is written
    await cd.nodes.flush()
    assert writes.nodes == ["node-1", "node-1"]
    assert cd.nodes.get("node-1").devices["NPU-0"]["health"] == "UnHealthy"
