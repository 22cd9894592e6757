"""A public fault table reload re-levels the ACTIVE public faults (issue 20): moving 020001001 from
SeparateNPU to SubHealthFault in ``--public-fault-config`` changes the level of the fault already
in the fault center (one update change each, logged "fault level updated"); a code the new table
no longer lists keeps its level."""

from __future__ import annotations

import json
import logging
import os
import time

import grpc
from support import eventually, make_clusterd, public_request

from faultmesh._pb import pubfault_pb2_grpc


def table(path, levels: dict[str, list[str]]) -> None:
    path.write_text(json.dumps({"publicFaultCode": levels, "publicFaultResource": ["CCAE"]}))


async def test_table_reload_relevels_active_public_faults(tmp_path, caplog):
    path = tmp_path / "public.json"
    table(path, {"SeparateNPUCodes": ["020001001", "020001002"]})
    cd = await make_clusterd(tmp_path, "--public-fault-config", str(path))
    changes: list = []
    cd.center.subscribe("relevel-test", changes.extend)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            stub = pubfault_pb2_grpc.PubFaultStub(ch)
            for fid, code in (("fault-0001", "020001001"), ("fault-0002", "020001002")):
                r = await stub.SendPublicFault(public_request(fid, code=code), timeout=5)
                assert r.code == 0, r.info
        assert sorted(f.level for f in cd.center.faults()) == ["SeparateNPU", "SeparateNPU"]
        await eventually(lambda: len(changes) == 2)
        caplog.set_level(logging.INFO, logger="clusterd")
        table(path, {"SubHealthFaultCodes": ["020001001"]})  # 020001002 no longer listed
        os.utime(path, (time.time() + 5, time.time() + 5))
        await eventually(lambda: len(changes) == 3)
        levels = {f.code: f.level for f in cd.center.faults()}
        assert levels == {"020001001": "SubHealthFault", "020001002": "SeparateNPU"}
        assert changes[2].kind == "update" and changes[2].fault.level == "SubHealthFault"
        assert "fault level updated" in caplog.text
        assert "old_level=SeparateNPU" in caplog.text and "new_level=SubHealthFault" in caplog.text
    finally:
        await cd.stop()
