"""State upgrades (issue 30): clusterd's state database records its schema version.

- A state dir written by the release before versioning (tests/fixtures/clusterd-state-v0, made by
  that release's own store: tests/fixtures/make_clusterd_state_v0.py) is migrated on open -- its
  faults, history, nodes, jobs, separations and scope marks survive, the version becomes current.
- A state dir from a newer release: clusterd refuses to start, exit 1, one log line naming both
  versions, the database untouched.
- An older layout no migration takes (a table with other columns): refused naming the table, and
  the database is left exactly as it was (the migration is one transaction).
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from support import ClusterdProcess

from clusterd.store import SCHEMA_VERSION, StateSchemaError, Store

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "clusterd-state-v0"
T0 = 1_796_000_000_000


def old_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(FIXTURE / "clusterd.db", state / "clusterd.db")
    return state


def user_version(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as c:
        return c.execute("PRAGMA user_version").fetchone()[0]


def test_the_fixture_is_an_unversioned_state_dir():
    header = (FIXTURE / "clusterd.db").read_bytes()[:100]  # read, not opened: the fixture stays as committed
    assert header.startswith(b"SQLite format 3\0") and int.from_bytes(header[60:64], "big") == 0
    assert SCHEMA_VERSION >= 1


async def test_a_state_dir_of_the_previous_release_is_migrated_and_keeps_its_data(tmp_path):
    state = old_state(tmp_path)
    store = Store(state)
    await store.open()
    try:
        faults = {
            (f.node, f.code): (f.level, f.first_seen_ms, origin) for f, origin in await store.load_faults()
        }
        assert faults == {
            ("node-a", "80E18008"): ("RestartNPU", T0, "deviced"),
            ("node-a", "0800004B"): ("PreSeparateFault", T0 + 1000, "noded"),
            ("node-b", "010001001"): ("SeparateNPU", T0 + 2000, "public"),
        }
        history = [(e["kind"], e["node"], e["code"]) for e in await store.query_events()]
        assert history == [
            ("occur", "node-a", "80C98000"),
            ("recover", "node-a", "80C98000"),
            ("occur", "node-a", "80E18008"),
            ("occur", "node-a", "0800004B"),
            ("occur", "node-b", "010001001"),
        ]
        assert (await store.load_nodes())["node-a"]["node_ip"] == "10.0.0.1"
        assert await store.kv_get("jobs", "default/job-1") == {"name": "job-1", "ranks": 4}
        assert await store.load_separations() == [("node-a", 7, "80E18008", T0 - 3000, T0 - 3000)]
        assert await store.load_marks() == {("node-a", "deviced"): b"digest-v0"}
        await store.append_events([(T0 + 5000, "recover", (await store.load_faults())[0][0])])  # writable
    finally:
        await store.close()
    assert user_version(state / "clusterd.db") == SCHEMA_VERSION


def test_clusterd_serves_the_migrated_state(tmp_path):
    """What a user sees after upgrading clusterd on the old state dir: its faults and history."""
    state = old_state(tmp_path)
    cd = ClusterdProcess(state, ["--agent-expire-after-s", "3600"]).start()
    try:
        codes = sorted(f["code"] for f in cd.get_json("/v1/faults"))
        assert codes == ["010001001", "0800004B", "80E18008", "ManuallySeparateNPU"]  # + the separation
        kinds = [e["kind"] for e in cd.get_json("/v1/events?node=node-a&code=80C98000")]
        assert kinds == ["occur", "recover"]
    finally:
        assert cd.stop() == 0
    assert "state schema migrated" in cd.log_text() and "from_version=0" in cd.log_text()
    cd2 = ClusterdProcess(state, ["--agent-expire-after-s", "3600"]).start()  # the second start: no migration
    try:
        assert len(cd2.get_json("/v1/faults")) == 4
    finally:
        cd2.stop()
    assert "state schema migrated" not in cd2.log_text()


def test_a_state_dir_from_a_newer_release_is_refused_naming_both_versions(tmp_path):
    state = old_state(tmp_path)
    db = state / "clusterd.db"
    with contextlib.closing(sqlite3.connect(db)) as c:  # closed: the WAL is checkpointed into the file
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 6}")
    before = db.read_bytes()
    cmd = [sys.executable, "-m", "clusterd", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
           "--state-dir", str(state)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "failed to start" in ln]
    assert len(lines) == 1, p.stdout + p.stderr
    assert f"state schema version {SCHEMA_VERSION + 6}" in lines[0]
    assert f"reads versions up to {SCHEMA_VERSION}" in lines[0]
    assert "Traceback" not in p.stdout + p.stderr
    assert db.read_bytes() == before and user_version(db) == SCHEMA_VERSION + 6


async def test_a_layout_no_migration_takes_is_refused_and_left_unchanged(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    db = state / "clusterd.db"
    with contextlib.closing(sqlite3.connect(db)) as c:  # unversioned, with a faults table not ours
        c.execute("CREATE TABLE faults (node TEXT, code TEXT)")
        c.execute("INSERT INTO faults VALUES ('n', 'c')")
        c.commit()
    store = Store(state)
    try:
        await store.open()
        raise AssertionError("opened a database with a foreign faults table")
    except StateSchemaError as e:
        msg = str(e)
    finally:
        await store.close()
    assert "cannot migrate the state from schema version 0 to" in msg and "table faults has columns" in msg
    with contextlib.closing(sqlite3.connect(db)) as c:
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"faults"}  # the migration's CREATE TABLEs were rolled back
        assert c.execute("PRAGMA user_version").fetchone()[0] == 0
        assert c.execute("SELECT * FROM faults").fetchall() == [("n", "c")]


async def test_a_new_state_dir_gets_the_current_version(tmp_path):
    store = Store(tmp_path / "state")
    await store.open()
    await store.close()
    assert user_version(tmp_path / "state" / "clusterd.db") == SCHEMA_VERSION
