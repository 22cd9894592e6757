"""NodeD's fault code -> fault level table (``NodeDConfiguration.json`` format) and its reloader.

Source: reference noded.md §2. The file is ``{"FaultTypeCode": {"NotHandleFaultCodes": [...],
"PreSeparateFaultCodes": [...], "SeparateFaultCodes": [...]}}``. Codes are upper-cased and
de-duplicated per level; each must be 8 letters/digits; a code listed under two levels rejects the
whole table (the previous table stays in force). faultmesh ships its own default table
(``noded/NodeDConfiguration.json``); ``--levels-file`` points at an operator's copy, which is
re-read when it changes.

Deliberate difference (design.md): a code in no list is not dropped but classified NotHandleFault
and marked unknown, so it is visible and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from faultmesh.faultrules import unknown_key
from faultmesh.files import FileWatch, stamp
from faultmesh.levels import NODE_STATUS_BY_LEVEL, NodeLevel
from faultmesh.log import event

log = logging.getLogger("noded.levels")

LEVEL_KEYS = {
    "NotHandleFaultCodes": NodeLevel.NotHandleFault,
    "PreSeparateFaultCodes": NodeLevel.PreSeparateFault,
    "SeparateFaultCodes": NodeLevel.SeparateFault,
}
CODE_RE = re.compile(r"^[a-zA-Z0-9]{8}$")
DEFAULT_TABLE = "NodeDConfiguration.json"


MAX_TABLE_BYTES = 4 * 1024 * 1024


class LevelTableError(ValueError):
    """A level table that cannot be used; the message names the problem (code, key, file)."""


class LevelTable:
    """Immutable code -> :class:`NodeLevel` map.

    ``levels``: upper-case code -> level; ``digest``: sha256 hex of the source bytes ("" when built
    in memory); ``path``: where it was read from.
    """

    def __init__(self, levels: dict[str, NodeLevel], digest: str = "", path: str = "") -> None:
        self.levels = dict(levels)
        self.digest = digest
        self.path = path

    def __len__(self) -> int:
        return len(self.levels)

    def classify(self, code: str) -> tuple[NodeLevel, bool]:
        """``code`` -> (level, known). Unknown codes are ``(NotHandleFault, False)``."""
        level = self.levels.get(code.upper())
        if level is None:
            return NodeLevel.NotHandleFault, False
        return level, True

    def by_level(self) -> dict[str, list[str]]:
        """The table in file form: key ("NotHandleFaultCodes", ...) -> sorted codes."""
        out: dict[str, list[str]] = {k: [] for k in LEVEL_KEYS}
        names = {v: k for k, v in LEVEL_KEYS.items()}
        for code, level in sorted(self.levels.items()):
            out[names[level]].append(code)
        return out

    @classmethod
    def from_json(cls, data: bytes | str, path: str = "") -> LevelTable:
        """Parse and validate a table. Raises :class:`LevelTableError`."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        where = path or "<table>"
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LevelTableError(f"{where}: not JSON: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("FaultTypeCode"), dict):
            raise LevelTableError(f"{where}: missing object FaultTypeCode")
        groups = doc["FaultTypeCode"]
        if bad := unknown_key(groups, list(LEVEL_KEYS), f"{where}: FaultTypeCode"):
            raise LevelTableError(bad)
        levels: dict[str, NodeLevel] = {}
        for key, level in LEVEL_KEYS.items():
            codes = groups.get(key, [])
            if codes is None:
                codes = []
            if not isinstance(codes, list):
                raise LevelTableError(f"{where}: {key} must be a list")
            for c in codes:
                if not isinstance(c, str) or not CODE_RE.match(c):
                    raise LevelTableError(f"{where}: {key}: fault code {c!r} is not 8 letters/digits")
                code = c.upper()
                prev = levels.get(code)
                if prev is not None and prev != level:
                    raise LevelTableError(
                        f"{where}: fault code {code} is in two levels ({prev.name}, {level.name})"
                    )
                levels[code] = level
        return cls(levels, hashlib.sha256(raw).hexdigest(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LevelTable:
        """Read and validate ``path``. Raises :class:`LevelTableError` (also for unreadable files)."""
        try:
            size = Path(path).stat().st_size
            if size > MAX_TABLE_BYTES:
                raise LevelTableError(f"{path}: {size} bytes, larger than {MAX_TABLE_BYTES}")
            raw = Path(path).read_bytes()
        except OSError as e:
            raise LevelTableError(f"{path}: cannot read: {e}") from None
        return cls.from_json(raw, str(path))

    @classmethod
    def default(cls) -> LevelTable:
        """faultmesh's own default table (package data ``noded/NodeDConfiguration.json``)."""
        raw = resources.files("noded").joinpath(DEFAULT_TABLE).read_bytes()
        return cls.from_json(raw, f"noded/{DEFAULT_TABLE}")


def node_status(levels) -> str:
    """Worst of an iterable of :class:`NodeLevel` -> ``Healthy`` / ``PreSeparate`` / ``UnHealthy``."""
    worst = max(levels, default=NodeLevel.NotHandleFault)
    return NODE_STATUS_BY_LEVEL[NodeLevel(worst)]


class LevelTableWatcher:
    """Holds the current :class:`LevelTable` and re-reads ``path`` when it changes.

    ``check()`` asks a :class:`faultmesh.files.FileWatch` (stat, then sha256); a valid new table replaces the
    current one and calls ``on_change(table)``; an invalid one is logged ("fault config rejected"),
    counted in ``rejected`` and the old table stays. ``path=None`` keeps the default table; a
    missing or invalid file at startup also starts with the default table (logged and counted).

    :meth:`apply_text` puts a table from elsewhere in force (``noded --kube``: the
    ``mindx-dl-node-fault-config`` ConfigMap, :mod:`noded.faultconfig`); from then on the file is no
    longer looked at (the reference's ConfigMap wins over its file and a deleted ConfigMap leaves
    the last table in force).
    """

    def __init__(
        self,
        path: str | None,
        on_change: Callable[[LevelTable], None] | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.on_change = on_change or (lambda t: None)
        self.on_reject = on_reject or (lambda reason: None)
        self.rejected = 0
        self.overridden_by = ""  # where the table in force came from when not the file
        self._watch = FileWatch(path) if path else None
        self.table = LevelTable.default()
        if path:
            assert self._watch is not None
            self._watch.changed()  # the first look: what is loaded below
            try:
                self.table = LevelTable.load(path)
            except LevelTableError as e:
                # as the reference falls back to its baked-in file: run with the default table and
                # apply the operator's file once it becomes valid
                self.rejected += 1
                self.on_reject("missing" if stamp(path) is None else "invalid")
                event(
                    log,
                    logging.ERROR,
                    "fault config rejected, using the default table",
                    path=path,
                    error=str(e),
                )
        event(log, logging.INFO, "fault config loaded", path=self.table.path, codes=len(self.table))

    def check(self) -> bool:
        """Re-read the file when it changed. Returns True when a new table took effect."""
        if self.overridden_by or not self.path or self._watch is None or not self._watch.changed():
            return False
        if stamp(self.path) is None:
            self.rejected += 1
            self.on_reject("missing")
            event(
                log,
                logging.WARNING,
                "fault config rejected",
                path=self.path,
                error="file missing",
                kept=self.table.digest[:12],
            )
            return False
        try:
            table = LevelTable.load(self.path)
        except LevelTableError as e:
            self.rejected += 1
            self.on_reject("invalid")
            event(
                log,
                logging.WARNING,
                "fault config rejected",
                path=self.path,
                error=str(e),
                kept=self.table.digest[:12],
            )
            return False
        if table.digest == self.table.digest:
            return False
        self.table = table
        event(
            log,
            logging.INFO,
            "update fault config success",
            path=self.path,
            codes=len(table),
            digest=table.digest[:12],
        )
        self.on_change(table)
        return True

    def apply_text(self, text: str, where: str, max_bytes: int = MAX_TABLE_BYTES) -> bool:
        """Validate ``text`` (a ``NodeDConfiguration.json`` document) and put it in force over the
        file. A bad one is logged ("fault config rejected"), counted (``on_reject("invalid")``) and
        the table in force stays. Returns True when a new table took effect."""
        raw = text.encode("utf-8", "replace")
        try:
            if len(raw) > max_bytes:
                raise LevelTableError(f"{where}: {len(raw)} bytes, larger than {max_bytes}")
            table = LevelTable.from_json(raw, where)
        except LevelTableError as e:
            self.rejected += 1
            self.on_reject("invalid")
            event(log, logging.WARNING, "fault config rejected", path=where, error=str(e),
                  kept=self.table.digest[:12])  # fmt: skip
            return False
        self.overridden_by = where
        if table.digest == self.table.digest:
            return False
        self.table = table
        event(log, logging.INFO, "update fault config success", path=where, codes=len(table),
              digest=table.digest[:12])  # fmt: skip
        self.on_change(table)
        return True

    async def run(self, interval_s: float = 5.0) -> None:
        """Call :meth:`check` every ``interval_s`` seconds, forever (cancel to stop)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.check()
            except Exception as e:  # never let a reload bug end the watcher
                event(log, logging.ERROR, "fault config check failed", error=repr(e))
