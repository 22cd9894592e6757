"""The schema of clusterd's state database and its upgrades (issue 30 "No upgrade story for state").

The database records its schema version in SQLite's header (``PRAGMA user_version``): 0 is a
database written before versioning (or a new, empty one), :data:`SCHEMA_VERSION` the one this
clusterd writes. :func:`prepare` runs when the store opens:

- the current version: nothing to do;
- an older one: the migrations from it up to :data:`SCHEMA_VERSION` run in ONE transaction
  (``BEGIN IMMEDIATE`` ... ``COMMIT``, the version set inside it), so a failure -- or a kill -- leaves
  the database as it was; a layout a migration cannot take (a table with other columns) is refused
  with :class:`StateSchemaError` naming the table, its columns and the expected ones;
- a newer one (written by a newer release: a downgrade) is refused with :class:`StateSchemaError`
  naming both versions. clusterd then exits 1 with one ``clusterd failed to start`` line.

Versions: 1 (this release) = the five state tables and the fault history (below); a version-0
database of any earlier release only ever lacked whole tables (scope_marks, separations,
fault_events came later), so migration 1 creates the missing ones and checks the columns of the rest.
A later schema change adds ``MIGRATIONS[n]`` and bumps :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from faultmesh.log import event

log = logging.getLogger("clusterd.store")

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS faults (
  node TEXT NOT NULL, device_type TEXT NOT NULL, device_id INTEGER NOT NULL,
  code TEXT NOT NULL, source TEXT NOT NULL,
  level TEXT NOT NULL, assertion TEXT NOT NULL,
  first_seen_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL, attributes TEXT NOT NULL,
  origin TEXT NOT NULL,
  PRIMARY KEY (node, device_type, device_id, code, source)
);
CREATE TABLE IF NOT EXISTS nodes (
  node TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
  ns TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
  PRIMARY KEY (ns, key)
);
CREATE TABLE IF NOT EXISTS scope_marks (
  node TEXT NOT NULL, origin TEXT NOT NULL, mark BLOB NOT NULL,
  PRIMARY KEY (node, origin)
);
CREATE TABLE IF NOT EXISTS separations (
  node TEXT NOT NULL, device_id INTEGER NOT NULL, codes TEXT NOT NULL,
  separated_ms INTEGER NOT NULL, last_fault_ms INTEGER NOT NULL,
  PRIMARY KEY (node, device_id)
);
"""

EVENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, ts_ms INTEGER NOT NULL, kind TEXT NOT NULL,
  node TEXT NOT NULL, device_type TEXT NOT NULL, device_id INTEGER NOT NULL,
  code TEXT NOT NULL, source TEXT NOT NULL, level TEXT NOT NULL, assertion TEXT NOT NULL,
  attributes TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS fault_events_node_ts ON fault_events (node, ts_ms);
CREATE INDEX IF NOT EXISTS fault_events_ts ON fault_events (ts_ms);
"""
"""Fault history (:mod:`clusterd.history`): one row per occur / update / recover, oldest pruned."""


class StateSchemaError(OSError):
    """The state database's schema version or layout is one this clusterd cannot use."""


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info({table})")]


def _expected_columns() -> dict[str, list[str]]:
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(SCHEMA + EVENTS_SCHEMA)
        tables = [r[0] for r in mem.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: _columns(mem, t) for t in tables if not t.startswith("sqlite_")}
    finally:
        mem.close()


def _to_1(db: sqlite3.Connection) -> None:
    """0 -> 1: check the columns of the tables there, create the missing tables and indexes."""
    for table, want in _expected_columns().items():
        have = _columns(db, table)
        if have and have != want:
            raise StateSchemaError(f"table {table} has columns {have}, version 1 has {want}")
    for stmt in _statements(SCHEMA + EVENTS_SCHEMA):
        db.execute(stmt)


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _to_1}
"""``MIGRATIONS[n]`` takes a version n-1 database to version n (inside the caller's transaction)."""


def schema_version(db: sqlite3.Connection) -> int:
    """The database's recorded schema version (0: unversioned or new)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def refuse_newer(db: sqlite3.Connection, path: Path) -> int:
    """The database's schema version; raises :class:`StateSchemaError` naming both versions when a
    newer release wrote it (a downgrade). Reads only."""
    found = schema_version(db)
    if found > SCHEMA_VERSION:
        raise StateSchemaError(
            f"{path} has state schema version {found}, written by a newer clusterd; this clusterd "
            f"reads versions up to {SCHEMA_VERSION} and does not downgrade: run a release that reads "
            f"version {found}, or restore a backup of the state dir taken before the upgrade"
        )
    return found


def prepare(db: sqlite3.Connection, path: Path) -> int:
    """Bring the database at ``path`` (open on ``db``, autocommit mode) to :data:`SCHEMA_VERSION`
    (see module docstring). Returns the version found. Raises :class:`StateSchemaError` for a newer
    version or a layout no migration takes (the database unchanged), ``sqlite3.Error`` on I/O."""
    found = refuse_newer(db, path)
    if found == SCHEMA_VERSION:
        return found
    fresh = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    db.execute("BEGIN IMMEDIATE")
    try:
        for version in range(found + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[version](db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException as e:
        if db.in_transaction:
            db.execute("ROLLBACK")
        if isinstance(e, StateSchemaError):
            raise StateSchemaError(
                f"{path}: cannot migrate the state from schema version {found} to {SCHEMA_VERSION} "
                f"({e}); the database is unchanged"
            ) from None
        raise
    if not fresh:
        event(
            log,
            logging.WARNING,
            "state schema migrated",
            path=str(path),
            from_version=found,
            to_version=SCHEMA_VERSION,
        )
    return found
