"""ClusterD's durable state: SQLite in WAL mode under ``--state-dir`` (issue 2 "Durable state").

Five tables: ``faults`` (the fault center, one row per FaultKey), ``nodes`` (the node registry: what
the agents last said about each node, one JSON row per node, :mod:`clusterd.nodes`) and ``kv``
(namespaced JSON values for components: jobs, data-trace switches, slow-node jobs, ...),
``separations`` (manually separated NPUs, :mod:`clusterd.separation`) and ``scope_marks`` (an
agent's last snapshot digest and node view per (node, origin), :mod:`clusterd.scopemarks`: written
only in the transaction of the faults it describes); plus the fault history. The schema and its
version live in :mod:`clusterd.storeschema`: an older state dir is migrated on open (one
transaction), one from a newer release is refused. Every write commits before the caller
acknowledges its sender, so an acked fault survives ``kill -9`` (WAL, synchronous=NORMAL: durable
against process death; ``--fsync full`` also against power loss).

All SQLite calls run in one dedicated writer thread (SQLite connections are single-threaded and a
commit may block), never on the event loop. Methods raise ``sqlite3.Error`` on I/O failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from clusterd.storeschema import SCHEMA_VERSION, StateSchemaError, prepare, refuse_newer
from faultmesh.model import Fault, FaultKey

__all__ = ["SCHEMA_VERSION", "StateDirBusy", "StateSchemaError", "Store"]


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite did not already (on SQLITE_FULL / SQLITE_IOERR it may
    roll back by itself; a ROLLBACK then fails with "no transaction is active" and would mask the
    real error). A failing ROLLBACK never replaces the error being raised."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


class StateDirBusy(OSError):
    """The state folder is held by another running clusterd (its ``clusterd.lock``)."""


class Store:
    """SQLite (WAL) state file ``<state_dir>/clusterd.db``. Open with :meth:`open`, close with :meth:`close`.

    One clusterd per state folder: :meth:`open` takes an exclusive ``flock`` on
    ``<state_dir>/clusterd.lock`` (holding the owner's pid) and raises :class:`StateDirBusy` when
    another process holds it; two writers on one SQLite file would be split-brain. The kernel drops
    the lock with the process, so a ``kill -9`` leaves nothing to clean up.

    ``busy_timeout_ms``: how long a write waits for another holder of the write lock before it
    raises ``sqlite3.OperationalError("database is locked")``.
    """

    def __init__(self, state_dir: str | Path, fsync_full: bool = False, busy_timeout_ms: int = 5000) -> None:
        self.path = Path(state_dir) / "clusterd.db"
        self._fsync_full = fsync_full
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)

    def _lock(self) -> None:
        lock = self.path.parent / "clusterd.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StateDirBusy(
                f"--state-dir {self.path.parent} is in use by another clusterd (pid {owner})"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._connect()
        except BaseException:
            self._unlock()
            raise

    def _connect(self) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            refuse_newer(db, self.path)  # before any write: a newer release's database stays untouched
        except BaseException:
            db.close()
            raise
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if self._fsync_full else 'NORMAL'}")
        db.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")
        try:
            prepare(db, self.path)  # schema version: create, migrate, or refuse (clusterd.storeschema)
        except BaseException:
            db.close()
            raise
        self._db = db

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self._db is not None

    async def open(self) -> None:
        """Create the folder and schema if needed, migrate an older schema. Raises ``sqlite3.Error`` /
        ``OSError`` (:class:`StateDirBusy`, :class:`clusterd.storeschema.StateSchemaError`)."""
        await self._run(self._open)

    async def close(self) -> None:
        """Checkpoint and close (idempotent)."""

        def _close() -> None:
            try:
                if self._db is not None:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    self._db.close()
                    self._db = None
            finally:
                self._unlock()

        await self._run(_close)
        self._exec.shutdown(wait=True)

    # -- faults ---------------------------------------------------------------------------------
    def _write_faults(
        self,
        upserts: list[tuple[Fault, str]],
        removals: list[FaultKey],
        marks: dict[tuple[str, str], bytes | None],
    ) -> None:
        db = self._db
        assert db is not None
        db.execute("BEGIN")
        try:
            if marks:
                gone = [scope for scope, m in marks.items() if m is None]
                if gone:
                    db.executemany("DELETE FROM scope_marks WHERE node=? AND origin=?", gone)
                db.executemany(
                    "INSERT OR REPLACE INTO scope_marks VALUES (?,?,?)",
                    [(n, o, m) for (n, o), m in marks.items() if m is not None],
                )
            if removals:
                db.executemany(
                    "DELETE FROM faults WHERE node=? AND device_type=? AND device_id=? AND code=? AND source=?",
                    [tuple(k) for k in removals],
                )
            if upserts:
                db.executemany(
                    "INSERT OR REPLACE INTO faults VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    [
                        (
                            f.node,
                            f.device_type,
                            f.device_id,
                            f.code,
                            f.source,
                            f.level,
                            f.assertion,
                            f.first_seen_ms,
                            f.last_seen_ms,
                            orjson.dumps(f.attributes).decode(),
                            origin,
                        )
                        for f, origin in upserts
                    ],
                )
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise

    async def write_faults(
        self,
        upserts: Iterable[tuple[Fault, str]] = (),
        removals: Iterable[FaultKey] = (),
        marks: dict[tuple[str, str], bytes | None] | None = None,
    ) -> None:
        """Apply upserts ((fault, origin) pairs), removals and scope ``marks`` ((node, origin) ->
        bytes, None: delete) in one transaction, committed on return."""
        up, rm = list(upserts), list(removals)
        if up or rm or marks:
            await self._run(self._write_faults, up, rm, marks or {})

    def _load_faults(self) -> list[tuple[Fault, str]]:
        assert self._db is not None
        rows = self._db.execute("SELECT * FROM faults").fetchall()
        return [
            (
                Fault(
                    source=r[4],
                    node=r[0],
                    device_type=r[1],
                    device_id=r[2],
                    code=r[3],
                    level=r[5],
                    assertion=r[6],
                    first_seen_ms=r[7],
                    last_seen_ms=r[8],
                    attributes=orjson.loads(r[9]),
                ),
                r[10],
            )
            for r in rows
        ]

    async def load_faults(self) -> list[tuple[Fault, str]]:
        """Every stored fault with its origin (the agent or component that owns it)."""
        return await self._run(self._load_faults)

    async def load_marks(self) -> dict[tuple[str, str], bytes]:
        """Every stored scope mark: (node, origin) -> bytes."""

        def _load():
            assert self._db is not None
            return self._db.execute("SELECT node, origin, mark FROM scope_marks").fetchall()

        return {(n, o): bytes(m) for n, o, m in await self._run(_load)}

    # -- fault history ------------------------------------------------------------------------------
    async def append_events(self, events: Iterable[tuple[int, str, Fault]]) -> None:
        """Append (ts_ms, kind, fault) rows to the fault history in one transaction."""
        rows = [
            (ts, kind, f.node, f.device_type, f.device_id, f.code, f.source, f.level, f.assertion,
             orjson.dumps(f.attributes).decode())
            for ts, kind, f in events
        ]  # fmt: skip
        if not rows:
            return

        def _write(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT INTO fault_events (ts_ms, kind, node, device_type, device_id, code, source,"
                " level, assertion, attributes) VALUES (?,?,?,?,?,?,?,?,?,?)",
                rows,
            )

        await self._run(self._in_tx, _write)

    async def query_events(
        self, node: str | None = None, code: str | None = None, since_ms: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """History rows (oldest first) of ``node`` / ``code`` at or after ``since_ms``: the newest
        ``limit`` of them, each a dict (ts_ms, kind, node, device_type, device_id, code, source,
        level, assertion, attributes)."""
        where, params = ["ts_ms >= ?"], [since_ms]
        if node:
            where.append("node = ?")
            params.append(node)
        if code:
            where.append("code = ?")
            params.append(code)
        sql = (
            "SELECT ts_ms, kind, node, device_type, device_id, code, source, level, assertion, attributes"
            f" FROM fault_events WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
        )

        def _query():
            assert self._db is not None
            return self._db.execute(sql, (*params, max(0, int(limit)))).fetchall()

        cols = ("ts_ms", "kind", "node", "device_type", "device_id", "code", "source", "level", "assertion")
        out = []
        for r in reversed(await self._run(_query)):
            row = dict(zip(cols, r[:9], strict=True))
            row["attributes"] = orjson.loads(r[9])
            out.append(row)
        return out

    async def prune_events(self, before_ms: int, max_rows: int) -> int:
        """Delete history rows older than ``before_ms`` and all but the newest ``max_rows``.
        Returns how many rows went."""

        def _prune(db: sqlite3.Connection) -> int:
            n = db.execute("DELETE FROM fault_events WHERE ts_ms < ?", (before_ms,)).rowcount
            top = db.execute(
                "SELECT id FROM fault_events ORDER BY id DESC LIMIT 1 OFFSET ?", (max(0, max_rows),)
            ).fetchone()
            if top is not None:
                n += db.execute("DELETE FROM fault_events WHERE id <= ?", (top[0],)).rowcount
            return n

        return await self._run(self._in_tx, _prune)

    def _in_tx(self, fn):
        db = self._db
        assert db is not None
        db.execute("BEGIN")
        try:
            out = fn(db)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)  # SQLite may have rolled back itself (disk full): keep the real error
            raise
        return out

    # -- nodes -----------------------------------------------------------------------------------
    async def write_nodes(self, states: dict[str, dict[str, Any]]) -> None:
        """Store each node's JSON-able state (node -> dict) in one transaction, committed on return."""
        rows = [(n, orjson.dumps(st, option=orjson.OPT_NON_STR_KEYS).decode()) for n, st in states.items()]
        if not rows:
            return

        def _write() -> None:
            db = self._db
            assert db is not None
            db.execute("BEGIN")
            try:
                db.executemany("INSERT OR REPLACE INTO nodes VALUES (?,?)", rows)
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise

        await self._run(_write)

    async def delete_nodes(self, names: list[str]) -> None:
        """Delete the stored state of ``names`` (forgotten nodes) in one transaction."""
        if not names:
            return

        def _delete() -> None:
            db = self._db
            assert db is not None
            db.execute("BEGIN")
            try:
                db.executemany("DELETE FROM nodes WHERE node = ?", [(n,) for n in names])
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise

        await self._run(_delete)

    async def load_nodes(self) -> dict[str, dict[str, Any]]:
        """Every stored node state (node -> dict)."""

        def _load():
            assert self._db is not None
            return self._db.execute("SELECT node, state FROM nodes").fetchall()

        return {n: orjson.loads(st) for n, st in await self._run(_load)}

    # -- kv ---------------------------------------------------------------------------------------
    async def kv_put(self, ns: str, key: str, value: Any) -> None:
        """Store a JSON-able ``value`` under (ns, key), committed when this returns."""
        blob = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()

        def _put() -> None:
            assert self._db is not None
            self._db.execute("INSERT OR REPLACE INTO kv VALUES (?,?,?)", (ns, key, blob))

        await self._run(_put)

    async def kv_get(self, ns: str, key: str, default: Any = None) -> Any:
        """The value stored under (ns, key), or ``default``."""

        def _get():
            assert self._db is not None
            return self._db.execute("SELECT value FROM kv WHERE ns=? AND key=?", (ns, key)).fetchone()

        row = await self._run(_get)
        return default if row is None else orjson.loads(row[0])

    async def kv_delete(self, ns: str, key: str) -> None:
        """Delete (ns, key) if present."""

        def _del() -> None:
            assert self._db is not None
            self._db.execute("DELETE FROM kv WHERE ns=? AND key=?", (ns, key))

        await self._run(_del)

    async def kv_items(self, ns: str) -> dict[str, Any]:
        """Every key -> value of namespace ``ns``."""

        def _items():
            assert self._db is not None
            return self._db.execute("SELECT key, value FROM kv WHERE ns=?", (ns,)).fetchall()

        return {k: orjson.loads(v) for k, v in await self._run(_items)}

    # -- separations ------------------------------------------------------------------------------
    async def put_separation(
        self, node: str, device_id: int, codes: str, separated_ms: int, last_fault_ms: int
    ) -> None:
        """Store (or update) one manually separated NPU, committed when this returns."""

        def _put() -> None:
            assert self._db is not None
            self._db.execute(
                "INSERT OR REPLACE INTO separations VALUES (?,?,?,?,?)",
                (node, device_id, codes, separated_ms, last_fault_ms),
            )

        await self._run(_put)

    async def delete_separation(self, node: str, device_id: int) -> None:
        """Forget one manually separated NPU (released)."""

        def _del() -> None:
            assert self._db is not None
            self._db.execute("DELETE FROM separations WHERE node=? AND device_id=?", (node, device_id))

        await self._run(_del)

    async def load_separations(self) -> list[tuple[str, int, str, int, int]]:
        """Every stored separation as (node, device_id, codes, separated_ms, last_fault_ms)."""

        def _load():
            assert self._db is not None
            return self._db.execute(
                "SELECT node, device_id, codes, separated_ms, last_fault_ms FROM separations"
            ).fetchall()

        return [tuple(r) for r in await self._run(_load)]
