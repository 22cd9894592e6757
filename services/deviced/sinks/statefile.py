"""The ``--state-file``: escalations (ManuallySeparateNPU, failed resets), frequency counters and the
active codes with their first-seen times, kept across restarts (issue 30: a restart is invisible to
the rules, see :func:`deviced.rules.restore_code`).

The engine exports / imports the document (:func:`deviced.rules.export_state`); this sink reads it
once after the chips are listed and rewrites it atomically (:class:`faultmesh.statefile.JsonStateFile`)
when its content changed, at the end of each cycle and once more at shutdown. A file that is
unreadable, corrupt, truncated or not a state file's shape is rejected: deviced starts with empty
rule state (as on a first start -- never an escalation), one log line says so, it is counted in
``faultmesh_deviced_state_file_rejected_total{reason}`` and kept as ``<path>.corrupt``.
"""

from __future__ import annotations

import collections
import logging

from deviced.engine import FaultEngine
from faultmesh.log import event
from faultmesh.statefile import JsonStateFile

log = logging.getLogger("deviced")


class StateFile:
    """The state file at ``path`` (None: off) for ``engine``. Write failures are logged and counted
    in ``errors[("state_file", "write failed")]``, rejected files in ``rejected[reason]``; nothing
    raises."""

    def __init__(self, path: str | None, engine: FaultEngine, errors: collections.Counter) -> None:
        self.file = JsonStateFile(path, log)
        self.engine = engine
        self.errors = errors
        self.rejected = self.file.rejected

    def restore(self) -> None:
        """Load the file into the engine (missing: nothing; rejected: empty rule state)."""
        data = self.file.load()
        if not data:
            return
        try:
            n = self.engine.import_state(data)
        except Exception as e:  # a state file's JSON, not its shape: nothing of it may stay
            ids = [d.ids for d in self.engine.devices.values()]
            self.engine.set_devices([])
            self.engine.set_devices(ids)  # every chip afresh
            self.file.reject("bad-shape", repr(e))
            return
        event(log, logging.INFO, "escalations restored", path=str(self.file.path), reasons=n)

    def save(self) -> None:
        """Write the engine's state when it changed since the last write."""
        failed = self.file.write_failures
        self.file.save(self.engine.export_state())
        if self.file.write_failures > failed:
            self.errors[("state_file", "write failed")] += 1
