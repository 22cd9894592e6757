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
