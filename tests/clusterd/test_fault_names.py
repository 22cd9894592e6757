"""``/v1/faults`` carries each code's short name (faultmesh.faultinfo) and ``faultmesh faults`` shows
it in a NAME column; codes without a meaning get "" (issue 13 "Meaning")."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp

from faultmesh.faultinfo import short_name
from faultmesh.model import Fault
from fmtools.cli import main as cli_main


def test_short_name_never_raises():
    assert short_name("80E18008") == "HBM error on the chip"
    assert short_name("0x80e18008") == "HBM error on the chip"
    assert short_name("[0x08520003,na,L2,na]") == "switch L2 port link down"
    assert short_name("ManuallySeparateNPU") == "" and short_name("") == "" and short_name("FFFFFFF0") == ""


async def test_faults_api_and_cli_carry_the_name(cd, capsys):
    for dev, code in ((2, "80E18008"), (3, "ManuallySeparateNPU")):
        f = Fault(
            source="dcmi", node="node-1", device_type="NPU", device_id=dev, code=code, level="RestartNPU"
        )
        await cd.center.upsert(f, origin="deviced")
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{cd.http.port}/v1/faults") as r:
            body = await r.json()
    assert {f["code"]: f["name"] for f in body} == {
        "80E18008": "HBM error on the chip",
        "ManuallySeparateNPU": "",
    }
    http = ["--http", f"127.0.0.1:{cd.http.port}"]
    assert await asyncio.to_thread(cli_main, ["faults", *http]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["NODE", "DEVICE", "ID", "CODE", "NAME", "LEVEL"]
    rows = [re.split(r"\s{2,}", line) for line in out[1:]]
    assert ["node-1", "NPU", "2", "80E18008", "HBM error on the chip", "RestartNPU"] in [r[:6] for r in rows]
    assert await asyncio.to_thread(cli_main, ["faults", *http, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["name"] == "HBM error on the chip"


async def test_a_gpu_fault_says_gpu_and_its_xid(cd, capsys):
    """issue 31 tryout: a GPU fault (deviced --backend nvml reports GPUs as device type NPU) showed
    DEVICE NPU and an empty NAME; the table says GPU and the XID's meaning from faultmesh's NVIDIA
    table (an XID it does not list says so), and the history says who reported it."""
    for dev, code in ((0, "4E560000004F"), (1, "4E56000003E7"), (2, "4E5600010001")):
        f = Fault(
            source="dcmi", node="gpu-1", device_type="NPU", device_id=dev, code=code, level="SeparateNPU"
        )
        await cd.center.upsert(f, origin="deviced")
    await cd.center.upsert(Fault("dcmi", "npu-1", "NPU", 0, "80E18008", "RestartNPU"), origin="deviced")
    http = ["--http", f"127.0.0.1:{cd.http.port}"]
    assert await asyncio.to_thread(cli_main, ["faults", *http, "-o", "wide"]) == 0
    rows = {
        r[0] + "/" + r[2]: r[:5]
        for r in (re.split(r"\s{2,}", ln) for ln in capsys.readouterr().out.splitlines()[1:])
    }
    assert rows["gpu-1/0"] == ["gpu-1", "GPU", "0", "4E560000004F", "Xid 79: GPU has fallen off the bus"]
    assert rows["gpu-1/1"][1:] == ["GPU", "1", "4E56000003E7", "Xid 999 (not in faultmesh's table)"]
    assert rows["gpu-1/2"][1:] == ["GPU", "2", "4E5600010001", "GPU is lost (NVML_ERROR_GPU_IS_LOST)"]
    assert rows["npu-1/0"][1] == "NPU"  # an Ascend chip stays an NPU
    await cd.center.drain_sinks(5.0)
    assert await asyncio.to_thread(cli_main, ["history", "--node", "gpu-1", *http]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "WHY" and len(lines) == 4
    assert all(ln.endswith("dcmi    reported by deviced (dcmi)") for ln in lines[1:]), lines


async def test_a_long_name_is_cut_after_a_whole_word(cd, capsys):
    """issue 31: the NAME column cut names mid-word; the table cuts after a whole word, -o wide shows
    the whole name."""
    full = "task hang: AI Core, memory, traffic and CPU time all idle for the detection window"
    assert short_name("200001002") == full
    f = Fault(
        source="public",
        node="node-1",
        device_type="NPU",
        device_id=0,
        code="200001002",
        level="SubHealthFault",
    )
    await cd.center.upsert(f, origin="public")
    http = ["--http", f"127.0.0.1:{cd.http.port}"]
    assert await asyncio.to_thread(cli_main, ["faults", *http]) == 0
    [row] = [re.split(r"\s{2,}", ln) for ln in capsys.readouterr().out.splitlines()[1:]]
    assert row[4] == "task hang: AI Core, memory…", row
    assert {w.strip(",:") for w in row[4].rstrip("…").split()} <= {w.strip(",:") for w in full.split()}
    assert await asyncio.to_thread(cli_main, ["faults", *http, "-o", "wide"]) == 0
    [row] = [re.split(r"\s{2,}", ln) for ln in capsys.readouterr().out.splitlines()[1:]]
    assert row[4] == full


def test_short_cuts_words_whole():
    from fmtools.cli.faults import short

    assert short("uncorrectable (multi-bit ECC) on-chip memory error") == "uncorrectable (multi-bit ECC)…"
    assert short("x" * 40) == "x" * 31 + "…"
    assert short("HBM error on the chip") == "HBM error on the chip"
