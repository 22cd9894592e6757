"""Staged shutdown under load: a real clusterd stops within its budget (< the chart's 30 s grace).

Load: agent streams that stay open (they hold the gRPC drain for its whole grace), thousands of
faults in the fault center and a PubFault flood still running when SIGTERM arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import grpc
from support import public_request

from faultmesh._pb import pubfault_pb2_grpc
from faultmesh.agent import AgentClient
from faultmesh.model import Fault

CHART_GRACE_S = 30.0


def _faults(node: str, n: int) -> list[Fault]:
    return [
        Fault(
            source="bmc-oem",
            node=node,
            device_type="Memory",
            device_id=i,
            code=f"{i:08X}",
            level="SubHealthFault",
        )
        for i in range(n)
    ]


async def _load_and_stop(cd, nodes: int = 16, faults_per_node: int = 200) -> float:
    """Connect ``nodes`` agents with faults, flood PubFault, SIGTERM; returns seconds to exit."""
    agents = []
    for i in range(nodes):
        a = AgentClient(cd.grpc, f"node-{i:03d}", "noded")
        for f in _faults(f"node-{i:03d}", faults_per_node):
            a.state.upsert(f)
        agents.append(a)
    stop_flood = asyncio.Event()

    async def flood() -> None:
        async with grpc.aio.insecure_channel(cd.grpc) as ch:
            stub = pubfault_pb2_grpc.PubFaultStub(ch)
            i = 0
            while not stop_flood.is_set():
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.SendPublicFault(
                        public_request(f"flood-{i:06d}", node=f"node-{i % nodes:03d}"), timeout=2
                    )
                i += 1

    try:
        for a in agents:
            await a.start()
        await asyncio.gather(*(a.wait_synced(60) for a in agents))
        flooder = asyncio.create_task(flood())
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        cd.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(cd.proc.wait, CHART_GRACE_S + 10)
        took = time.monotonic() - t0
        assert rc == 0
        stop_flood.set()
        await asyncio.wait_for(flooder, 10)
        return took
    finally:
        stop_flood.set()
        for a in agents:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(a.stop(), 10)


async def test_clusterd_under_load_stops_within_its_budget(clusterd_process):
    cd = clusterd_process()
    took = await _load_and_stop(cd)
    assert took < CHART_GRACE_S, f"clusterd took {took:.1f}s to stop"
    log = cd.log_text()
    assert "clusterd stopped" in log
    assert log.count("stop requested signal=SIGTERM") == 1  # the operator sees why it stops


async def test_stage_budgets_are_capped_by_the_total_budget(clusterd_process):
    # Each stage alone would take longer than the whole budget: open agent streams hold the gRPC
    # drain for its full grace (20 s here), yet the process is gone soon after the 6 s total.
    cd = clusterd_process("--drain-s", "20", "--component-stop-s", "20", "--shutdown-budget-s", "6")
    took = await _load_and_stop(cd, nodes=4, faults_per_node=50)
    assert took < 6 + 5, f"clusterd took {took:.1f}s with a 6 s budget"
    assert "clusterd stopped" in cd.log_text()
