"""The node registry: typed, persisted, one health (issue 12)."""

from __future__ import annotations

from support import make_clusterd

from faultmesh.levels import HEALTHY, SUB_HEALTHY, UNHEALTHY
from faultmesh.model import Fault


async def test_node_state_survives_a_restart(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        cd.nodes.hello("node-1", "10.0.0.1", "SN-1", "boot-a")
        cd.nodes.update(
            "node-1", devices=[{"device_type": "NPU", "device_id": 0, "health": "Healthy"}], status="Healthy"
        )
    finally:
        await cd.stop()  # the final write of the staged shutdown
    cd = await make_clusterd(tmp_path)
    try:
        st = cd.nodes.get("node-1")
        assert st is not None and (st.node_ip, st.node_sn, st.boot_id) == ("10.0.0.1", "SN-1", "boot-a")
        assert st.devices["NPU-0"]["health"] == "Healthy" and st.node_status == "Healthy"
        assert cd.nodes.by_sn() == {"SN-1": "node-1"}
    finally:
        await cd.stop()


async def test_one_health_from_faults_and_reported_status(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        assert cd.nodes.health("node-1").health == HEALTHY
        await cd.center.upsert(Fault("deviced", "node-1", "NPU", 0, "80E18402", "SubHealthFault"))
        assert cd.nodes.health("node-1") == (SUB_HEALTHY, "SubHealthFault")
        cd.nodes.set_status("node-1", "kube:nodeinfo", UNHEALTHY)  # any reporter saying UnHealthy wins
        assert cd.nodes.health("node-1").health == UNHEALTHY and cd.nodes.unhealthy() == {"node-1"}
        assert cd.registry.get_sample_value("faultmesh_node_unhealthy", {"node": "node-1"}) == 1
        cd.nodes.set_status("node-1", "kube:nodeinfo", None)
        assert cd.nodes.health("node-1").health == SUB_HEALTHY
    finally:
        await cd.stop()


async def test_agent_labels_survive_a_restart_and_go_with_the_agent(tmp_path):
    # deviced's graceTolerance=on (issue 32 item 9) holds right after a clusterd restart, before
    # deviced reconnects; a Hello without labels, or the agent forgotten, drops them
    cd = await make_clusterd(tmp_path)
    try:
        cd.nodes.hello("node-1", "10.0.0.1", "", "boot-a", "deviced", {"graceTolerance": "on"})
        cd.nodes.hello("node-1", "10.0.0.1", "", "boot-b", "noded")
        cd.nodes.agent_seen("node-1", "deviced")
        cd.nodes.agent_seen("node-1", "noded")
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path)
    try:
        assert cd.nodes.get("node-1").labels == {"deviced": {"graceTolerance": "on"}}
        assert cd.nodes.labelled("node-1", lambda ls: ls.get("graceTolerance") == "on")
        assert not cd.nodes.labelled("node-2", lambda ls: True)
        cd.nodes.forget_agent("node-1", "deviced")
        assert cd.nodes.get("node-1").labels == {}
        cd.nodes.hello("node-1", "10.0.0.1", "", "boot-c", "deviced", {"graceTolerance": "on"})
        cd.nodes.hello("node-1", "10.0.0.1", "", "boot-d", "deviced")  # restarted without the mode
        assert not cd.nodes.labelled("node-1", lambda ls: ls.get("graceTolerance") == "on")
    finally:
        await cd.stop()
