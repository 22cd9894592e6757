"""A state write the store refuses (full disk, I/O error) on any HTTP route is a counted, logged 503
that names the store's error -- never a bare 500 with a traceback, never missed by the "state writes
failing" alert (faultmesh_store_errors_total; tryout finding: job apply on a full disk)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

from support import http_call, make_clusterd

JOB = {
    "id": "job-1",
    "name": "train",
    "namespace": "default",
    "ranks": [{"rank": 0, "node": "node-a", "device": 0}],
}


async def call(cd, method: str, path: str, body=None):
    url = f"http://127.0.0.1:{cd.http.port}{path}"
    return await asyncio.to_thread(http_call, method, url, body)


async def test_job_apply_and_delete_on_a_full_disk_are_503_counted_and_change_nothing(
    tmp_path, monkeypatch, caplog
):
    cd = await make_clusterd(tmp_path)
    try:
        assert (await call(cd, "POST", "/v1/jobs", JOB))[0] == 200

        async def full(*a, **k):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(cd.ctx.store, "kv_put", full)
        monkeypatch.setattr(cd.ctx.store, "kv_delete", full)
        caplog.set_level(logging.ERROR)
        st, body = await call(cd, "POST", "/v1/jobs", {**JOB, "id": "job-2", "name": "other"})
        assert st == 503 and body == {"error": "state write failed: database or disk is full"}, body
        st, body = await call(cd, "DELETE", "/v1/jobs/job-1")
        assert st == 503 and body["error"] == "state write failed: database or disk is full", body
        assert cd.ctx.center.store_errors._value.get() == 2
        assert [r.getMessage() for r in caplog.records if "state write failed" in r.getMessage()]
        # clusterd's own loggers (grpc's poller may log a previous test's closed loop here)
        ours = [r for r in caplog.records if r.name.split(".")[0] in ("clusterd", "faultmesh", "aiohttp")]
        assert not [r for r in ours if r.exc_info], "no traceback for a refused write"
        st, body = await call(cd, "GET", "/v1/jobs")  # memory holds what the store holds
        assert st == 200 and [j["id"] for j in body] == ["job-1"], body
    finally:
        await cd.stop()
