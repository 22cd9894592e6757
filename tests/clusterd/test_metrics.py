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


async def test_per_fault_series_on_metrics(tmp_path):
    """issue 31: one series per active fault (node, device type, device, code, level; no id, no
    time) on the HTTP /metrics, read from the fault index at scrape time; gone once recovered."""
    import re

    import aiohttp

    cd = await make_clusterd(tmp_path)
    try:
        await cd.center.upsert(Fault("deviced", "node-2", "NPU", 3, "80E18402", "SubHealthFault"))
        await cd.center.upsert(Fault("noded", "node-2", "NPU", 3, "80E18402", "SubHealthFault"))
        await cd.center.upsert(Fault("noded", "node-1", "Node", -1, "0800004B", "SeparateFault"))

        async def scrape() -> dict[str, float]:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"http://127.0.0.1:{cd.http.port}/metrics") as r:
                    assert r.status == 200
                    text = await r.text()
            return {k: float(v) for k, v in re.findall(r"^(faultmesh_active_fault\S*) (\S+)$", text, re.M)}

        got = await scrape()
        assert got == {
            'faultmesh_active_fault{node="node-1",device_type="Node",device="-1",code="0800004B",level="SeparateFault"}': 1,
            'faultmesh_active_fault{node="node-2",device_type="NPU",device="3",code="80E18402",level="SubHealthFault"}': 2,
            "faultmesh_active_fault_series_dropped": 0,
        }
        await cd.center.remove(Fault("noded", "node-1", "Node", -1, "0800004B", "SeparateFault").key)
        got = await scrape()
        assert [k for k in got if "node-1" in k] == []
    finally:
        await cd.stop()


def test_per_fault_series_cap_keeps_the_worst_and_counts_the_rest():
    """Past the cap the worst levels are written (then node order) and the rest counted; a change
    re-renders only its node, and a recovered fault's series goes (the next scrape)."""
    import re

    from clusterd.faultindex import FaultIndex
    from clusterd.faultseries import FaultSeriesCollector

    def scrape(c) -> tuple[list[str], float]:
        text = c.text().decode()
        nodes = re.findall(r'^faultmesh_active_fault\{node="([^"]+)"', text, re.M)
        return nodes, float(re.search(r"^faultmesh_active_fault_series_dropped (\S+)$", text, re.M)[1])

    index = FaultIndex()
    for i in range(5):
        index.put(Fault("deviced", f"node-{i}", "NPU", 0, "80E18402", "SubHealthFault"), "deviced")
    index.put(Fault("deviced", "node-9", "NPU", 1, "80E01801", "SeparateNPU"), "deviced")
    c = FaultSeriesCollector(index, cap=3)
    assert scrape(c) == (["node-9", "node-0", "node-1"], 3.0)
    index.put(Fault("deviced", "node-3", "NPU", 2, "80E01801", "SeparateNPU"), "deviced")
    assert scrape(c) == (["node-3", "node-9", "node-0"], 4.0)
    index.drop(Fault("deviced", "node-9", "NPU", 1, "80E01801", "SeparateNPU").key)
    index.drop(Fault("deviced", "node-0", "NPU", 0, "80E18402", "SubHealthFault").key)
    assert scrape(c) == (["node-3", "node-1", "node-2"], 2.0)
    assert scrape(FaultSeriesCollector(index)) == (["node-3", "node-1", "node-2", "node-3", "node-4"], 0.0)


def test_docs_state_the_per_fault_series_cap():
    """docs/metrics.md gives the cap the code applies (an operator sizes Prometheus from it)."""
    import re

    from support import ROOT

    from clusterd.faultseries import MAX_FAULT_SERIES

    docs = (ROOT / "docs" / "metrics.md").read_text()
    m = re.search(r"at most ([\d,]+)\s+`faultmesh_active_fault` series", docs)
    assert m, "docs/metrics.md does not state the faultmesh_active_fault cap"
    assert int(m[1].replace(",", "")) == MAX_FAULT_SERIES
