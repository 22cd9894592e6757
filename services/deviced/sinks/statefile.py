"""The ``--state-file``: escalations (ManuallySeparateNPU, failed resets), frequency counters and the
active codes with their first-seen times, kept across restarts (issue 30: a restart is invisible to
the rules, see :func:`deviced.rules.restore_code`).

The engine exports / imports the document (:func:`deviced.rules.export_state`); this sink reads it
once after the chips are listed and rewrites it atomically (:func:`faultmesh.files.atomic_write`)
when its content changed, at the end of each cycle and once more at shutdown.
"""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

from deviced.engine import FaultEngine
from faultmesh.files import atomic_write
from faultmesh.log import event

log = logging.getLogger("deviced")


class StateFile:
    """The state file at ``path`` (None: off) for ``engine``. Write failures are logged and counted
    in ``errors[("state_file", "write failed")]``, never raised."""

    def __init__(self, path: str | None, engine: FaultEngine, errors: collections.Counter) -> None:
        self.path = Path(path) if path else None
        self.engine = engine
        self.errors = errors
        self._saved = ""

    def restore(self) -> None:
        """Load the file into the engine (missing: nothing; unreadable: logged, ignored)."""
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            event(log, logging.ERROR, "state file unreadable", path=str(self.path), error=str(e))
            return
        n = self.engine.import_state(data if isinstance(data, dict) else {})
        self._saved = json.dumps(self.engine.export_state(), sort_keys=True)
        event(log, logging.INFO, "escalations restored", path=str(self.path), reasons=n)

    def save(self) -> None:
        """Write the engine's escalations when they changed since the last write."""
        if self.path is None:
            return
        body = json.dumps(self.engine.export_state(), sort_keys=True)
        if body == self._saved:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, body.encode())
            self._saved = body
        except OSError as e:
            self.errors[("state_file", "write failed")] += 1
            event(log, logging.ERROR, "state file write failed", path=str(self.path), error=str(e))
