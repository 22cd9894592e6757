"""Slow-node enable / disable never change memory unless the store took the change (issue 19's rule
for the FD-OL part): a value nothing can store is 400, a failed write 503 with the old job intact."""

from __future__ import annotations

import asyncio
import sqlite3

from support import http_call, make_clusterd

PLACEMENT = {"0": "node-a", "1": "node-a"}


def conf(job: str = "j1", **kw) -> dict:
    d = {"jobName": job, "jobNamespace": "default", "normalNumber": 20, "nSecondsDoOneDetection": 5,
         "cardOneNode": 16, "SlowNode": 1, "ranks": PLACEMENT}  # fmt: skip
    return d | kw


async def call(cd, method: str, path: str, body=None):
    url = f"http://127.0.0.1:{cd.http.port}{path}"
    return await asyncio.to_thread(http_call, method, url, body)


async def test_unstorable_values_are_400_and_change_nothing(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        assert (await call(cd, "POST", "/v1/slownode/jobs", conf()))[0] == 200
        st, body = await call(cd, "POST", "/v1/slownode/jobs", conf(cardOneNode=10**20))
        assert st == 400 and "cannot be stored" in body["error"], body
        st, body = await call(cd, "POST", "/v1/slownode/jobs", conf(ranks={str(10**20): "node-a"}))
        assert st == 400, body
        st, body = await call(cd, "GET", "/v1/slownode/j1")
        assert st == 200 and body["enabled"] and body["ranks"] == {"0": "node-a", "1": "node-a"}, body
    finally:
        await cd.stop()


async def test_a_failed_state_write_is_503_and_the_running_job_stays(tmp_path, monkeypatch):
    cd = await make_clusterd(tmp_path)
    try:
        assert (await call(cd, "POST", "/v1/slownode/jobs", conf()))[0] == 200

        async def full(*a, **k):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(cd.ctx.store, "kv_put", full)
        monkeypatch.setattr(cd.ctx.store, "kv_delete", full)
        st, body = await call(cd, "POST", "/v1/slownode/jobs", conf(normalNumber=30))
        assert st == 503 and body["error"] == "state write failed: database or disk is full", body
        st, body = await call(cd, "POST", "/v1/slownode/j1/disable")
        assert st == 503, body
        st, body = await call(cd, "GET", "/v1/slownode/j1")  # the old job runs on, unchanged
        assert st == 200 and body["enabled"] and body["featConf"]["normalNumber"] == 20, body
    finally:
        await cd.stop()
    cd = await make_clusterd(tmp_path)  # what was stored is what comes back
    try:
        st, body = await call(cd, "GET", "/v1/slownode/j1")
        assert st == 200 and body["featConf"]["normalNumber"] == 20, body
    finally:
        await cd.stop()
