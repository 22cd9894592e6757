"""PubFault in the fault center's writer (issue 28): the cache cap is judged by the writer on the exact
state (concurrent requests cannot pass it together), the delete deadlines are stored with the faults
and kept across a restart, and a recover that came before its occur survives a restart."""

from __future__ import annotations

import asyncio
import time

from support import make_clusterd, public_request

from faultmesh._pb import pubfault_pb2


def recover_request(fault_id: str, node: str = "node-1") -> pubfault_pb2.PublicFaultRequest:
    req = public_request(fault_id, node=node)
    req.id = f"req-rec-{fault_id}"
    req.faults[0].assertion = "recover"
    return req


async def gone(cd, fault_id: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(f.attributes.get("faultId") == fault_id for f in cd.center.faults()):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_concurrent_requests_cannot_pass_the_cap_together(tmp_path):
    cd = await make_clusterd(tmp_path, "--public-fault-max-items", "2")
    try:
        reqs = [public_request(f"fault-race-{i}", node=f"node-{i}") for i in range(6)]
        answers = await asyncio.gather(*(cd.pubfault.intake(r) for r in reqs))
        codes = sorted(a.code for a in answers)
        assert codes == [0, 0, 409, 409, 409, 409]
        assert len(cd.center.faults()) == 2
        assert all("public fault cache full" in a.info for a in answers if a.code == 409)
    finally:
        await cd.stop()


async def test_a_recover_before_its_occur_survives_a_restart(tmp_path):
    args = ("--public-fault-delete-delay-s", "3")
    cd = await make_clusterd(tmp_path, *args)
    try:
        assert (await cd.pubfault.intake(recover_request("fault-early-1"))).code == 0
        assert cd.center.faults() == []  # nothing to remove yet: the recover waits for its occur
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path, *args)
    try:
        assert (await cd.pubfault.intake(public_request("fault-early-1"))).code == 0
        [f] = cd.center.faults()
        assert int(f.attributes["expires_ms"]) > 0  # the stored recover gave the occur its deadline
        assert await gone(cd, "fault-early-1", timeout_s=8.0)
    finally:
        await cd.stop()


async def test_a_once_fault_due_while_clusterd_was_down_goes_at_the_first_sweep(tmp_path):
    args = ("--public-fault-delete-delay-s", "0.5")
    cd = await make_clusterd(tmp_path, *args)
    try:
        req = public_request("fault-once-1")
        req.faults[0].assertion = "once"
        assert (await cd.pubfault.intake(req)).code == 0
        assert len(cd.center.faults()) == 1
    finally:
        await cd.stop()
    await asyncio.sleep(0.6)  # its deadline passes while clusterd is down
    cd = await make_clusterd(tmp_path, *args)
    try:
        assert len(cd.center.faults()) == 1  # restored with its stored deadline
        assert await gone(cd, "fault-once-1", timeout_s=5.0)
    finally:
        await cd.stop()
