"""A public fault table with an unknown key or a malformed code is refused whole (docs/fault-tables.md
"Bad input, for every table"), found by the new-user tryout: a misspelt ``SeperateNPUCodes`` was taken
as an empty table (``codes=0``) and every public fault then answered 409 "there is no valid fault".
At start clusterd stops with the reason; on reload the last good table stays, logged and counted."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import grpc
import pytest
from support import eventually, make_clusterd, public_request

from clusterd.api.pubfault import PublicFaultTable, TableError
from faultmesh._pb import pubfault_pb2_grpc

MISSPELT = {"publicFaultCode": {"SeperateNPUCodes": ["020001001"]}, "publicFaultResource": ["CCAE"]}
GOOD = {"publicFaultCode": {"SeparateNPUCodes": ["020001001"]}, "publicFaultResource": ["CCAE"]}


@pytest.mark.parametrize(
    "doc, why",
    [
        (MISSPELT, "publicFaultCode: unknown key 'SeperateNPUCodes'"),
        ({**GOOD, "publicFaultResources": ["x"]}, "unknown key 'publicFaultResources'"),
        (
            {"publicFaultCode": {"SeparateNPUCodes": ["zz"]}, "publicFaultResource": ["CCAE"]},
            "'zz' is not 9 digits",
        ),
        (
            {"publicFaultCode": {"SubHealthFaultCodes": ["01000100A"]}, "publicFaultResource": ["CCAE"]},
            "'01000100A' is not 9 digits",
        ),
        (
            {"publicFaultCode": {"SeparateNPUCodes": [20001001]}, "publicFaultResource": ["CCAE"]},
            "is not 9 digits",
        ),
        (
            {"publicFaultCode": {"SeparateNPUCodes": "020001001"}, "publicFaultResource": ["CCAE"]},
            "must be a list",
        ),
    ],
)
def test_bad_table_is_refused_naming_the_key(tmp_path, doc, why):
    path = tmp_path / "pub.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TableError) as e:
        PublicFaultTable.load(path)
    assert str(path) in str(e.value) and why in str(e.value), e.value


def test_table_over_4_mib_is_refused_before_parsing(tmp_path):
    path = tmp_path / "pub.json"
    path.write_text(json.dumps(GOOD) + " " * (4 << 20))
    with pytest.raises(TableError, match="larger than 4194304"):
        PublicFaultTable.load(path)


def test_reference_table_and_null_lists_load(tmp_path):
    ref = PublicFaultTable.load(
        os.path.join(
            os.path.dirname(__file__),
            "..",
            "..",
            "services",
            "clusterd",
            "tables",
            "publicFaultConfiguration.json",
        )
    )
    assert len(ref.levels) == 30 and ref.levels["110001022"] == "PreSeparateNPU"
    path = tmp_path / "pub.json"
    path.write_text(
        json.dumps({"publicFaultCode": {"NotHandleFaultCodes": None}, "publicFaultResource": ["CCAE"]})
    )
    assert PublicFaultTable.load(path).levels == {}


def test_misspelt_table_at_start_stops_clusterd_with_the_key(tmp_path):
    (tmp_path / "pub.json").write_text(json.dumps(MISSPELT))
    cmd = [sys.executable, "-m", "clusterd", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]
    cmd += ["--state-dir", "st", "--public-fault-config", "pub.json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "clusterd failed to start" in out and "unknown key 'SeperateNPUCodes'" in out, out
    assert "Traceback" not in out, out


async def test_misspelt_reload_keeps_the_last_good_table(tmp_path, caplog):
    path = tmp_path / "pub.json"
    path.write_text(json.dumps(GOOD))
    cd = await make_clusterd(tmp_path, "--public-fault-config", str(path))
    caplog.set_level(logging.INFO, logger="clusterd")
    labels = {"service": "pubfault", "reason": "table_rejected"}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cd.grpc_port}") as ch:
            stub = pubfault_pb2_grpc.PubFaultStub(ch)
            for n, bad in enumerate(
                (
                    MISSPELT,
                    {"publicFaultCode": {"SeparateNPUCodes": ["zz"]}, "publicFaultResource": ["CCAE"]},
                ),
                start=1,
            ):
                path.write_text(json.dumps(bad))
                os.utime(path, (time.time() + 5 * n, time.time() + 5 * n))
                await eventually(
                    lambda n=n: (
                        cd.registry.get_sample_value("faultmesh_rejected_requests_total", labels) == n
                    ),
                    what=f"bad table {n} counted",
                )
                r = await stub.SendPublicFault(public_request(f"fault-000{n}", code="020001001"), timeout=5)
                assert (r.code, r.info) == (0, "public fault send successfully")
        assert {f.level for f in cd.center.faults()} == {"SeparateNPU"}
        rejected = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("public fault table rejected" in m and "SeperateNPUCodes" in m for m in rejected), rejected
        assert any("public fault table rejected" in m and "'zz' is not 9 digits" in m for m in rejected), (
            rejected
        )
        assert not any("public fault table reloaded" in r.getMessage() for r in caplog.records)
    finally:
        await cd.stop()
