"""Fault history (issue 17): every occur / update / recover kept with bounded retention, read over
``GET /v1/events`` and ``faultmesh history``, one clusterd log line per change."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import aiohttp
import pytest
from support import make_clusterd

from faultmesh.model import Fault, now_ms


async def _until(pred, timeout_s: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _events(cd, **q):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{cd.http.port}/v1/events", params=q) as r:
            return r.status, await r.json()


def _cli(cd, *argv):
    return subprocess.run(
        [sys.executable, "-m", "faultmesh", *argv, "--http", f"127.0.0.1:{cd.http.port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_history_answers_what_happened_on_a_node_and_survives_restart(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="clusterd.history")
    cd = await make_clusterd(tmp_path)
    try:
        f = Fault("deviced", "node-7", "NPU", 3, "80E18402", "SubHealthFault")
        await cd.center.upsert(f)
        await cd.center.upsert(Fault("deviced", "node-7", "NPU", 3, "80E18402", "RestartNPU"))
        await cd.center.remove(f.key)
        await cd.center.upsert(Fault("noded", "node-8", "Node", -1, "00000001", "NotHandleFault"))

        async def three():
            return len((await _events(cd, node="node-7"))[1]) == 3

        await _until(three)
        st, rows = await _events(cd, node="node-7")
        assert st == 200
        assert [(r["kind"], r["level"]) for r in rows] == [
            ("occur", "SubHealthFault"),
            ("update", "RestartNPU"),
            ("recover", "RestartNPU"),
        ]
        assert all(r["code"] == "80E18402" and r["device_id"] == 3 for r in rows)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fault changed")]
        assert (
            "fault changed kind=occur node=node-7 device=NPU-3 code=80E18402 level=SubHealthFault source=deviced"
            in lines
        )
        assert any("kind=recover node=node-7" in x for x in lines)
        # filters
        assert len((await _events(cd, code="00000001"))[1]) == 1
        assert (await _events(cd, since="1h"))[1][-1]["node"] == "node-8"
        assert (await _events(cd, since=str(now_ms() + 60_000)))[1] == []
        st, body = await _events(cd, since="yesterday-ish")
        assert st == 400 and "duration" in body["error"]
        # the CLI, as a user runs it
        r = await asyncio.to_thread(_cli, cd, "history", "--node", "node-7")
        assert r.returncode == 0, r.stderr
        out = r.stdout.splitlines()
        assert out[0].split()[:4] == ["TIME", "CHANGE", "NODE", "DEVICE"]
        assert [ln.split()[2] for ln in out[1:]] == ["occur", "update", "recover"]
        assert "NPU-3" in out[1] and "80E18402" in out[1]
        r = await asyncio.to_thread(_cli, cd, "history", "--code", "00000001", "-o", "json")
        assert r.returncode == 0 and json.loads(r.stdout)[0]["node"] == "node-8"
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path)
    try:
        assert len((await _events(cd, node="node-7"))[1]) == 3  # kept in the state file
    finally:
        await cd.stop()


async def test_history_retention_bounds_rows_and_age(tmp_path):
    cd = await make_clusterd(tmp_path, "--history-max-rows", "5", "--history-prune-s", "3600")
    try:
        hist = next(c for c in cd.components if c.name == "history")
        for i in range(8):
            await cd.center.upsert(Fault("deviced", "node-1", "NPU", i, "80E18402", "SubHealthFault"))

        async def eight():
            return len((await _events(cd))[1]) == 8

        await _until(eight)
        assert await hist.prune() == 3
        rows = (await _events(cd))[1]
        assert [r["device_id"] for r in rows] == [3, 4, 5, 6, 7]  # the newest kept
        hist.retention_ms = -60_000  # everything is now older than the retention
        assert await hist.prune() == 5 and (await _events(cd))[1] == []
    finally:
        await cd.stop()


async def test_history_rebuilds_lost_changes_on_resync(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        hist = next(c for c in cd.components if c.name == "history")
        a = Fault("deviced", "node-1", "NPU", 0, "80E18402", "SubHealthFault")
        await cd.center.upsert(a)
        await _until(lambda: _has(cd, 1))
        b = Fault("deviced", "node-1", "NPU", 1, "80E18402", "SubHealthFault")
        await hist.resync([b])  # as if a's recover and b's occur were lost in an overflow
        rows = (await _events(cd))[1]
        assert [(r["kind"], r["device_id"]) for r in rows[1:]] == [("occur", 1), ("recover", 0)]
    finally:
        await cd.stop()


async def _has(cd, n):
    return len((await _events(cd))[1]) == n


def test_since_out_of_range_is_a_clear_error():
    """``since`` beyond SQLite's integer range or an overflowing duration: ValueError (HTTP 400),
    not a 500 from the store; a duration reaching before the epoch means everything kept."""
    from faultmesh.config import parse_since

    for text in ("999999999999999999999999999", "1e400h"):
        with pytest.raises(ValueError, match="since"):
            parse_since(text, now=1_000)
    assert parse_since("2d", now=1_000) == 0
    assert parse_since("1500", now=1_000) == 1500


async def test_history_rows_the_store_refused_are_written_once_it_takes_them(tmp_path, monkeypatch, caplog):
    # a full disk refused the history rows of acked faults: they are kept and written, in order,
    # once the store takes writes again (the tryout lost two acked faults' rows this way)
    from clusterd import history

    monkeypatch.setattr(history, "RETRY_S", 0.05)
    caplog.set_level(logging.INFO, logger="clusterd.history")
    cd = await make_clusterd(tmp_path)
    try:
        real = cd.ctx.store.append_events
        refuse = [True]

        async def full(rows):
            if refuse[0]:
                raise OSError(28, "database or disk is full")
            await real(rows)

        monkeypatch.setattr(cd.ctx.store, "append_events", full)
        for i in range(3):
            await cd.center.upsert(Fault("deviced", "node-1", "NPU", i, "80E18402", "SubHealthFault"))
        await asyncio.sleep(0.3)
        assert (await _events(cd))[1] == []
        assert sum("history write failed" in r.getMessage() for r in caplog.records) == 1  # once, not per try
        refuse[0] = False
        await _until(lambda: _has(cd, 3))
        assert [r["device_id"] for r in (await _events(cd))[1]] == [0, 1, 2]
        assert any("history written after retries" in r.getMessage() for r in caplog.records)
    finally:
        await cd.stop()


async def test_a_bad_limit_is_a_clear_400_and_the_cli_refuses_it_as_usage(tmp_path, capsys):
    """``limit=abc`` answered Python's int() text; ``history --limit 0`` went to the server and
    exited 5 where ``--limit abc`` exited 2 (tryout findings)."""
    import asyncio

    from support import http_call, make_clusterd

    from fmtools.cli import main as cli_main

    cd = await make_clusterd(tmp_path)
    try:
        for bad in ("abc", "0", "-3", "100001"):
            url = f"http://127.0.0.1:{cd.http.port}/v1/events?limit={bad}"
            st, body = await asyncio.to_thread(http_call, "GET", url)
            assert st == 400 and body == {"error": f"limit must be an integer 1..100000, got '{bad}'"}, body
    finally:
        await cd.stop()
    for bad in ("abc", "0"):
        with pytest.raises(SystemExit) as e:
            cli_main(["history", "--limit", bad, "--http", "127.0.0.1:1"])
        assert e.value.code == 2 and "--limit" in capsys.readouterr().err


async def test_a_fault_that_occurred_while_clusterd_was_down_is_listed_at_its_own_time(tmp_path):
    """history listed an outage's fault at the reconnect (21:32:59) where /v1/faults said it was
    first seen at 21:32:45 (tryout finding): an occur row carries the fault's first-seen time."""
    cd = await make_clusterd(tmp_path)
    try:
        seen = now_ms() - 600_000  # ten minutes before clusterd heard of it
        await cd.center.upsert(
            Fault("deviced", "node-9", "NPU", 1, "80E18008", "RestartNPU", first_seen_ms=seen)
        )
        await cd.center.upsert(Fault("deviced", "node-9", "NPU", 2, "80E18008", "RestartNPU"))  # no time: now
        month = now_ms() - 30 * 86_400_000  # before the 7-day retention: it would be pruned at once
        await cd.center.upsert(
            Fault("deviced", "node-9", "NPU", 4, "80E18008", "RestartNPU", first_seen_ms=month)
        )

        async def three():
            return len((await _events(cd, node="node-9"))[1]) == 3

        await _until(three)
        rows = {r["device_id"]: r["ts_ms"] for r in (await _events(cd, node="node-9"))[1]}
        assert rows[1] == seen and now_ms() - rows[2] < 60_000 and now_ms() - rows[4] < 60_000
    finally:
        await cd.stop()
