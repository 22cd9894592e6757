"""Pending sources (issue 20): a snapshot's ``pending_sources`` keep ClusterD's faults of those
sources (marked pending in the node view, the node status kept) until the agent says the source
completed its first poll; then the next snapshot clears what the source no longer reports."""

from __future__ import annotations

from support import eventually

from faultmesh.agent import AgentClient
from faultmesh.model import Fault


def hw(code: str, dev: int = 0, source: str = "bmc-oem") -> Fault:
    return Fault(
        source=source, node="node-1", device_type="Memory", device_id=dev, code=code, level="SeparateFault"
    )


async def test_pending_source_keeps_its_faults_until_its_first_poll(cd):
    first = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    first.state.upsert(hw("00000001"))
    first.state.upsert(hw("00000009", source="dpc"))
    first.state.set_node_status("UnHealthy")
    await first.start()
    await first.wait_synced()
    await first.stop()
    # the restarted agent: bmc-oem not polled yet, dpc polled (its fault is gone)
    again = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    again.state.expect_sources(["bmc-oem"])
    again.state.set_node_status("Healthy")  # what noded says before its first BMC poll
    await again.start()
    try:
        await again.wait_synced()
        await eventually(lambda: [f.code for f in cd.center.faults("node-1")] == ["00000001"])
        assert cd.nodes.pending_sources("node-1") == ["noded/bmc-oem"]
        assert cd.nodes.status("node-1") == "UnHealthy"
        assert cd.nodes.health("node-1").health == "UnHealthy"
        # the first poll completes: the fault is gone on the hardware
        again.state.set_node_status("Healthy")
        assert again.state.source_ready(["bmc-oem"])
        assert not again.state.source_ready(["bmc-oem"])
        await again.wait_synced()
        await eventually(lambda: cd.center.faults("node-1") == [])
        assert cd.nodes.pending_sources("node-1") == []
        assert cd.nodes.status("node-1") == "Healthy"
    finally:
        await again.stop()


async def test_too_many_pending_sources_are_rejected(cd):
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded")
    client.state.expect_sources([f"s{i}" for i in range(65)])
    await client.start()
    try:
        await eventually(lambda: client.acked_seq >= 1)
        assert "node-1" not in cd.nodes or cd.nodes.pending_sources("node-1") == []
    finally:
        await client.stop()
