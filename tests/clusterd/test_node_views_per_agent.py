"""A node's two agents each own their views: a noded snapshot (after a noded restart) keeps
deviced's device states, a deviced snapshot keeps noded's BMC conditions (found by the digest work:
a snapshot replaced the node's conditions and devices wholesale)."""

from __future__ import annotations

from support import make_clusterd, until

from faultmesh._pb import agent_pb2
from faultmesh.agent import AgentClient


def npu(i: int, health: str = "Healthy") -> agent_pb2.DeviceState:
    return agent_pb2.DeviceState(device_type="NPU", device_id=i, phy_id=i, health=health,
                                 network_health="Healthy", super_pod_id=-1, server_index=-1)  # fmt: skip


def views(cd, node: str) -> tuple[set, set]:
    st = cd.ctx.nodes.get(node)
    return set(st.conditions), set(st.devices)


async def test_each_agents_snapshot_replaces_only_its_own_views(tmp_path):
    cd = await make_clusterd(tmp_path)
    addr = f"127.0.0.1:{cd.grpc_port}"
    noded = AgentClient(addr, "node-1", "noded", backoff_max_s=0.2)
    deviced = AgentClient(addr, "node-1", "deviced", backoff_max_s=0.2)
    noded.state.set_condition("BMCUnreachable", True, "timeout")
    for i in range(2):
        deviced.state.set_device(npu(i))
    try:
        for c in (noded, deviced):
            await c.start()
            await c.wait_synced(10)
        assert views(cd, "node-1") == ({"BMCUnreachable"}, {"NPU-0", "NPU-1"})
        # noded restarts with another state: its snapshot must not take deviced's devices
        await noded.stop()
        noded = AgentClient(addr, "node-1", "noded", backoff_max_s=0.2)
        noded.state.set_condition("BMCUnsupported", True, "no OEM")
        await noded.start()
        await noded.wait_synced(10)
        await until(lambda: views(cd, "node-1")[0] == {"BMCUnsupported"}, 5)
        assert views(cd, "node-1") == ({"BMCUnsupported"}, {"NPU-0", "NPU-1"})
        # and deviced's own snapshot replaces its devices only
        await deviced.stop()
        deviced = AgentClient(addr, "node-1", "deviced", backoff_max_s=0.2)
        deviced.state.set_device(npu(1, "UnHealthy"))
        await deviced.start()
        await deviced.wait_synced(10)
        await until(lambda: views(cd, "node-1")[1] == {"NPU-1"}, 5)
        assert views(cd, "node-1") == ({"BMCUnsupported"}, {"NPU-1"})
        assert cd.ctx.nodes.get("node-1").devices["NPU-1"]["health"] == "UnHealthy"
    finally:
        await noded.stop()
        await deviced.stop()
        await cd.stop()
