"""Storage faults (issue 19 #1): a write that did not commit is never acked, never kept in memory,
and a retry after it is stored. Injectors: a state file that fills (SQLite ``max_page_count``:
the real SQLITE_FULL path), a second connection holding the write lock past the busy timeout, and a
store whose commit raises ``database or disk is full``."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from prometheus_client import CollectorRegistry
from support import make_clusterd, public_request

from clusterd.center import FaultCenter, StoreWriteError
from clusterd.store import Store
from faultmesh.model import Fault


def _fault(i: int, node: str = "node-1", source: str = "noded") -> Fault:
    return Fault(
        source=source, node=node, device_type="NPU", device_id=i, code="8C1F8609", level="SeparateFault"
    )


class FailingWrites:
    """Wrap ``store.write_faults``: the next ``n`` calls raise ``error`` (before touching the file)."""

    def __init__(self, store: Store, n: int = 1, error: Exception | None = None) -> None:
        self.store, self.n = store, n
        self.error = error or sqlite3.OperationalError("database or disk is full")
        self._real = store.write_faults
        store.write_faults = self._write  # type: ignore[method-assign]

    async def _write(self, upserts=(), removals=(), marks=None):
        if self.n > 0:
            self.n -= 1
            raise self.error
        await self._real(upserts, removals, marks)


@pytest.fixture
async def center(tmp_path):
    store = Store(tmp_path / "state", busy_timeout_ms=200)
    await store.open()
    c = FaultCenter(store, CollectorRegistry())
    task = asyncio.create_task(c.run())
    yield c, store
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await store.close()


async def test_failed_commit_is_not_kept_in_memory_and_a_retry_is_stored(center):
    c, store = center
    FailingWrites(store, 1)
    with pytest.raises(StoreWriteError, match="database or disk is full"):
        await c.upsert(_fault(0))
    assert c.get(_fault(0).key) is None and len(c) == 0
    assert c.store_errors._value.get() == 1
    await c.upsert(_fault(0))  # the retry is applied again, not answered "nothing changed"
    assert [f.key for f, _ in await store.load_faults()] == [_fault(0).key]


async def test_failed_snapshot_and_removal_are_undone(center):
    c, store = center
    await c.replace_origin("node-1", "noded", [_fault(0), _fault(1)])
    FailingWrites(store, 2)
    with pytest.raises(StoreWriteError):
        await c.replace_origin("node-1", "noded", [_fault(2)])
    with pytest.raises(StoreWriteError):
        await c.remove(_fault(0).key)
    assert sorted(f.device_id for f in c.faults()) == [0, 1]
    assert sorted(f.device_id for f in c.faults_of_origin("noded")) == [0, 1]
    assert (c.index.count_of_origin("noded"), c.index.groups_of_origin("noded")) == (2, 1)
    await c.replace_origin("node-1", "noded", [_fault(2)])
    assert [f.device_id for f, _ in await store.load_faults()] == [2]
    assert [f.device_id for f in c.faults()] == [2]


async def test_full_disk_reports_the_real_error_not_the_rollback(center):
    c, store = center
    await c.upsert(_fault(0))

    def fill() -> None:  # the state file may not grow past its current size: SQLITE_FULL
        store._db.execute("PRAGMA max_page_count=1").fetchall()

    await store._run(fill)
    big = [
        Fault("noded", "node-1", "NPU", i, "8C1F8609", "SeparateFault", attributes={"x": "y" * 2000})
        for i in range(1, 50)
    ]
    with pytest.raises(StoreWriteError) as err:
        await c.apply(big, [], "noded")
    assert "full" in str(err.value) and "cannot rollback" not in str(err.value)
    assert len(c) == 1


async def test_write_lock_held_past_busy_timeout_is_not_acked(center):
    c, store = center
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the 200 ms busy timeout
    try:
        with pytest.raises(StoreWriteError, match="locked"):
            await c.upsert(_fault(3))
        assert c.get(_fault(3).key) is None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await c.upsert(_fault(3))
    assert [f.device_id for f, _ in await store.load_faults()] == [3]


async def test_pubfault_retry_of_the_same_fault_id_after_a_failed_write_is_stored(tmp_path):
    cd = await make_clusterd(tmp_path)
    try:
        center, pub = cd.center, cd.pubfault
        FailingWrites(cd.store, 1)
        resp = await pub.intake(public_request("fault-retry-1"))
        assert resp.code == 599 and "database or disk is full" in resp.info
        assert center.faults() == []
        resp = await pub.intake(public_request("fault-retry-1"))
        assert resp.code == 0
        stored = await cd.store.load_faults()
        assert [f.attributes["faultId"] for f, _ in stored] == ["fault-retry-1"]
    finally:
        await cd.stop()


async def test_agent_delta_sent_during_a_failed_write_is_resent_and_stored(tmp_path):
    from faultmesh.agent import AgentClient

    cd = await make_clusterd(tmp_path)
    client = AgentClient(f"127.0.0.1:{cd.grpc_port}", "node-1", "noded", backoff_max_s=0.2)
    client.state.upsert(_fault(0))
    await client.start()
    try:
        await client.wait_synced()
        failing = FailingWrites(cd.store, 1)
        client.state.upsert(_fault(1))
        await asyncio.sleep(0.5)  # the delta fails; the stream ends; the agent reconnects
        assert failing.n == 0
        await client.wait_synced()
        assert client.metrics.reconnects._value.get() >= 2
        assert sorted(f.device_id for f in cd.center.faults("node-1")) == [0, 1]
        assert sorted(f.device_id for f, _ in await cd.store.load_faults()) == [0, 1]
    finally:
        await client.stop()
        await cd.stop()


async def test_a_second_clusterd_on_the_same_state_dir_is_refused_until_the_first_closes(tmp_path):
    """Two writers on one SQLite file would be split-brain (tryout finding: a second clusterd on a
    running one's --state-dir started and served): the second open names the folder and the owner."""
    import os

    from clusterd.app import start_error
    from clusterd.store import StateDirBusy

    first = Store(tmp_path)
    await first.open()
    second = Store(tmp_path)
    with pytest.raises(StateDirBusy) as e:
        await second.open()
    msg = start_error(e.value, type("A", (), {"state_dir": str(tmp_path)}))
    assert msg == f"--state-dir {tmp_path} is in use by another clusterd (pid {os.getpid()})"
    await first.close()
    await second.open()  # the lock goes with the first store's close (or its process)
    assert second.is_open
    await second.close()
