"""ClusterD's metrics for alerting (issue 17): build info, process metrics, no ``*_created`` series,
the node-health state set."""

from __future__ import annotations

from prometheus_client import generate_latest
from support import make_clusterd

from faultmesh.model import Fault


async def test_node_health_state_set_build_info_and_no_created(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        cd.nodes.hello("node-1", "10.0.0.1", "SN-1", "boot")
        await cd.center.upsert(Fault("deviced", "node-2", "NPU", 0, "80E18402", "SubHealthFault"))
        get = cd.registry.get_sample_value
        assert [
            get("faultmesh_node_health", {"node": "node-1", "health": h})
            for h in ("Healthy", "SubHealthy", "UnHealthy")
        ] == [1, 0, 0]
        assert [
            get("faultmesh_node_health", {"node": "node-2", "health": h})
            for h in ("Healthy", "SubHealthy", "UnHealthy")
        ] == [0, 1, 0]
        text = generate_latest(cd.registry).decode()
        assert 'service="clusterd"' in text and "faultmesh_build_info{" in text
        assert "process_resident_memory_bytes" in text
        assert "_created" not in text
    finally:
        await cd.stop()
